/*
 * util/flight.h - the flight recorder's files (engine/comm/comm_watchdog.c writes them when the
 * watchdog ends a hung job) and their comparison, for the watchdog's last line and `wlbtrain inspect
 * DIR`.
 *
 * DIR/flight-rank-R.txt, text:
 *   wlbtrain flight recorder 1
 *   rank R world N reason hang|stop now T
 *   attempt A                         the launch it belongs to (engine/comm/runtime.h's
 *                                     runtime_attempt: the launcher's job, step and restart count)
 *   group G NAME ID SIZE BEGUN        one per group of more than one rank: its id (lowest world
 *                                     rank), size, and the collectives and messages begun on it
 *   op SEQ G NAME ID GSEQ OP N PEER T0 T1   the last 512, oldest first; GSEQ the group's own count
 *                                     (the same collective has the same GSEQ on every member, since
 *                                     each group's collectives are issued in one order); PEER -1
 *                                     for a collective; T1 0 while in flight
 * flight_compare reads every rank's file and names the first collective where the ranks disagree:
 * the one a rank waits in (its oldest in flight) that members of its group never began - either
 * their file shows fewer begun on that group, or they left no file (a rank stopped, killed or hung
 * outside a collective cannot write one). Only the files of one attempt are compared: the caller's,
 * or (NULL) that of the newest file; a file without an attempt line (written before there was one)
 * belongs to the attempt "unknown".
 *
 * flight_set_aside moves every record of another attempt than the caller's into
 * DIR/flight-attempts/ATTEMPT/ (made when needed): a requeued job's first hang is kept, and never
 * read as its second's. Several ranks may do it at once (a file another rank moved is skipped).
 */
#ifndef WLB_UTIL_FLIGHT_H
#define WLB_UTIL_FLIGHT_H

#include <stddef.h>

#include "util/error.h"

#define FLIGHT_MAGIC "wlbtrain flight recorder 1"
#define FLIGHT_FILE_FORMAT "flight-rank-%d.txt"
#define FLIGHT_ATTEMPTS_DIR "flight-attempts"
enum { FLIGHT_ATTEMPT_MAX = 128 };

/* The comparison of DIR's files of attempt (NULL: the newest file's) as one line (no "wlbtrain:
 * error:" prefix) into line. world: the job's ranks (0: as the files say). An Error when DIR holds no
 * flight recorder file of the attempt or one that is malformed. */
int flight_compare(const char *dir, int world, const char *attempt, char *line, size_t size, Error *err);
/* Moves DIR's records of other attempts than attempt aside (see above); a DIR that does not exist has
 * none. A record that cannot be moved is a warning (the comparison skips it anyway). */
int flight_set_aside(const char *dir, const char *attempt, Error *err);

#endif
