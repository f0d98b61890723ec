/* cli/cli_help.c - the help texts and --version. */
#include <stdio.h>
#include <string.h>
#include <yaml.h>
#include <zlib.h>
#include <jansson.h>
#include <mpi.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "cli/cli.h"
#include "engine/backend.h"

#define WLB_VERSION "0.1.0"

static const char help_main[] =
    "wlbtrain " WLB_VERSION " - workload-balanced 4D-parallel training of Llama models\n"
    "\n"
    "Usage:\n"
    "  wlbtrain --config FILE [--set KEY=VALUE]... [--steps N] [--trace STEPS] [--print-config]\n"
    "  wlbtrain --config FILE --dry-run [--compare] [--stats-out FILE] [--no-memory-check] [--steps N]\n"
    "  wlbtrain --config FILE --dry-run --search [--gpus N] [--search-out FILE] [--stats-out FILE]\n"
    "  mpirun -np N wlbtrain --config FILE ...      (or srun -n N wlbtrain ...)\n"
    "  wlbtrain inspect PREFIX\n"
    "  wlbtrain convert --out PREFIX [options] INPUT...\n"
    "  wlbtrain export --checkpoint PATH --out DIR [--dtype D] [--max-shard-size SIZE]\n"
    "  wlbtrain calibrate --config FILE [--set KEY=VALUE]... --out PROFILE\n"
    "  wlbtrain eval (--checkpoint PATH | --init-from PATH) [--config FILE] [--set KEY=VALUE]...\n"
    "  wlbtrain --help | --help-config | --version\n"
    "\n"
    "Run options:\n"
    "  --config FILE      the YAML config of the run (see config/examples/ and --help-config)\n"
    "  --set KEY=VALUE    override one config key, such as --set parallel.tp=2 or\n"
    "                     --set data.path=[a,b]; parsed and checked like the file; repeatable,\n"
    "                     applied in order after the file; an empty value unsets a string or\n"
    "                     list key (--set data.path= for a dry run on data.lengths_file)\n"
    "  --steps N          override train.steps (also the number of steps a dry run plans)\n"
    "  --trace STEPS      trace these steps (such as 3-5,10): a timeline per rank in PyTorch\n"
    "                     profiler's JSON format (trace.steps; docs/timelines.md)\n"
    "  --print-config     print the resolved config (preset and defaults expanded) as YAML\n"
    "                     that loads back to the same config, and exit\n"
    "  --dry-run          plan every step for every rank of the configured cluster in this one\n"
    "                     process (no MPI launch, no GPU) and report the predicted imbalance\n"
    "  --compare          with --dry-run: every packer with every CP sharding mode on the same\n"
    "                     documents, as one table\n"
    "  --stats-out FILE   with --dry-run: one JSON object per step, and a summary last;\n"
    "                     with --search: one per layout\n"
    "  --no-memory-check  with --dry-run: plan a layout whose ranks need more memory than\n"
    "                     train.gpu_memory_gb (reported, not refused): the planner's figures\n"
    "                     for a stack with memory savings wlbtrain's engine does not have\n"
    "  --search           with --dry-run: try every layout of the cluster (tp, cp, pp, dp,\n"
    "                     virtual stages, train.recompute, parallel.zero, S_max) that fits,\n"
    "                     plan each on the config's data (--steps, default 100) and print the\n"
    "                     ten fastest, the config's own marked (docs/layout-search.md)\n"
    "  --gpus N           with --search: the cluster's GPUs (default: the config's layout's)\n"
    "  --search-out FILE  with --search: write the fastest layout as a config file\n"
    "  --search-all       with --search: plan every layout, also those that do not fit and\n"
    "                     those planned once for another (slow: the reference of the pruning)\n"
    "\n"
    "Subcommands:\n"
    "  inspect PREFIX     describe a Megatron data set (PREFIX.idx + PREFIX.bin): documents,\n"
    "                     tokens, token type, vocabulary bound, document length percentiles;\n"
    "                     inspect DIR of a hung job's flight recorder files: the collective\n"
    "                     where its ranks disagree and the ranks that never reached it\n"
    "  convert            tokenize text files or JSON lines into a Megatron data set\n"
    "                     (wlbtrain convert --help)\n"
    "  export             a checkpoint as a Hugging Face model folder (wlbtrain export --help)\n"
    "  calibrate          measure the cost model's rates on train.device and write a profile\n"
    "                     for balance.calibration (wlbtrain calibrate --help)\n"
    "  eval               the validation loss of a checkpoint or of saved weights\n"
    "                     (wlbtrain eval --help)\n"
    "\n"
    "Other:\n"
    "  --help, -h         this text (wlbtrain SUBCOMMAND --help for a subcommand's)\n"
    "  --help-config      every config key: type, range, default and meaning\n"
    "  --version          version, and whether the CUDA backend is compiled in\n"
    "\n"
    "Flags take their value as the next argument or after '=' (--steps=10).\n"
    "Errors are one line, 'wlbtrain: error: WHERE: WHAT'; exit status 2 for bad input (config,\n"
    "flags, data), 1 for a failure at run time. SIGUSR1 or SIGTERM stops training after the step\n"
    "in flight with a checkpoint, exit status 75 (resume with checkpoint.resume=auto);\n"
    "train.stop_after stops it the same way with status 0.\n";

static const char help_inspect[] =
    "Usage: wlbtrain inspect PREFIX\n"
    "\n"
    "Describes the Megatron indexed data set PREFIX.idx + PREFIX.bin (MMIDIDX version 1, token\n"
    "dtype 4 = int32 or 8 = uint16): documents, sequences, tokens, token dtype, vocabulary bound\n"
    "(largest token id + 1, read from every token of the .bin), and the document length\n"
    "percentiles p50, p90, p99 and the maximum. Every count, size and offset of the files is\n"
    "checked first; a truncated or corrupted set is one error line and exit status 2.\n"
    "\n"
    "wlbtrain inspect DIR, DIR a folder holding flight-rank-R.txt files (the flight recorder that\n"
    "every rank writes when parallel.timeout_s ends a hung job: docs/slurm.md), names the first\n"
    "collective where the ranks disagree - the one some wait in that others never began - and the\n"
    "ranks that never reached it (or left no file: stopped, killed, hung outside a collective).\n"
    "\n"
    "wlbtrain inspect CHECKPOINT, a step folder (step-NNNNNNNN) or a checkpoint folder (its latest),\n"
    "checks it as a resume does and reads every file whole: its step, run, layout and files, and\n"
    "what was checked; a swapped, stale, foreign or damaged file is one error line and exit status 2.\n";

static const char help_convert[] =
    "Usage: wlbtrain convert --out PREFIX [options] INPUT...\n"
    "\n"
    "Tokenizes documents into the Megatron data set PREFIX.idx + PREFIX.bin, one sequence per\n"
    "document. Each text INPUT is one document; each non-blank line of a JSON-lines INPUT is one\n"
    "document (its --json-key field; documents whose text is empty are skipped and counted). .gz\n"
    "inputs are read through zlib. Each document is [BOS] + its ids + [EOD] (see --bos, --eod).\n"
    "Ids equal tiktoken's encode_ordinary (a ranks file) or the tokenizers library's encode with\n"
    "encode_special_tokens (a tokenizer.json): text such as <|end_of_text|> is ordinary text\n"
    "unless --special-tokens match, and invalid UTF-8 is kept byte for byte.\n"
    "\n"
    "Options:\n"
    "  --out PREFIX         where to write (PREFIX.idx, PREFIX.bin; replaced only when complete:\n"
    "                       a failed convert leaves no output and an existing set untouched)\n"
    "  --tokenizer FILE     BPE ranks in tiktoken format (such as the Llama 3 tokenizer.model) or a\n"
    "                       Hugging Face tokenizer.json (byte-level BPE: Llama 3, GPT-2, ...);\n"
    "                       default: byte-level tokens (id = byte value, vocabulary 257)\n"
    "  --pattern NAME       pre-tokenizer regex: llama3 or gpt2 (default: gpt2 for a 50,256-rank\n"
    "                       file, else llama3); only with a ranks file (a tokenizer.json has its own)\n"
    "  --format F           text or jsonl (default: jsonl for *.jsonl and *.jsonl.gz, else text)\n"
    "  --json-key KEY       the field holding the text in JSON lines (default: text)\n"
    "  --files-from FILE    more input paths, one per line ('-' = standard input), after the\n"
    "                       INPUTs; relative to the current directory; blank lines are skipped\n"
    "  --bos ID|none        begin-of-text token put first in every document (default: the\n"
    "                       tokenizer's: 128000 Llama 3 (ranks file or tokenizer.json), a\n"
    "                       tokenizer.json's when its post_processor or tokenizer_config.json adds\n"
    "                       one; none byte-level and GPT-2). A text that starts with the BOS\n"
    "                       token's text (<|begin_of_text|>) gets that as its BOS, not a second one\n"
    "  --eod ID|none        end-of-document token appended to every document (default: the\n"
    "                       tokenizer's end-of-text: 256 byte-level, 128001 Llama 3 (128,000\n"
    "                       ranks), 50256 GPT-2 (50,256 ranks), else the number of ranks; for a\n"
    "                       tokenizer.json tokenizer_config.json's eos_token, else its template's\n"
    "                       or a special token <|end_of_text|>, <|endoftext|>, </s> or <eos>)\n"
    "  --special-tokens M   ordinary (default): special-token text in the input is plain text;\n"
    "                       match: it is the special token, as the tokenizers library's encode\n"
    "                       does by default (tokenizer.json only)\n"
    "  --dtype D            auto, uint16 or int32 (auto: uint16 when every id - the vocabulary,\n"
    "                       the BOS and the EOD - is below 65536, else int32)\n"
    "  --quiet              no progress lines on stderr (at most one a second otherwise)\n"
    "\n"
    "Prints one summary line on stdout: documents, tokens, dtype, vocabulary, BOS, EOD, output.\n";

static const char help_export[] =
    "Usage: wlbtrain export --checkpoint PATH --out DIR [--dtype D] [--max-shard-size SIZE]\n"
    "\n"
    "Writes a Hugging Face model folder that transformers (4 and 5) and vLLM load with\n"
    "from_pretrained(DIR): config.json (a LlamaConfig made from the checkpoint's config.yaml, with\n"
    "rope_theta and rope_scaling, bos_token_id and eos_token_id), generation_config.json, the\n"
    "checkpoint's weights under Hugging Face names (model.safetensors, or shards\n"
    "model-0000N-of-0000M.safetensors and model.safetensors.index.json), and the tokenizer files when\n"
    "the run knows them (train.init_from's model folder, or data.tokenizer).\n"
    "\n"
    "Options:\n"
    "  --checkpoint PATH    a checkpoint folder (checkpoint.dir: its latest is taken), that\n"
    "                       latest file, or one of its step-NNNNNNNN folders\n"
    "  --out DIR            the model folder (created; each file in it is replaced only when\n"
    "                       complete; weight files of an earlier export are removed)\n"
    "  --dtype D            auto (default: the dtype of train.init_from's model folder, else\n"
    "                       bfloat16 for train.precision bf16, float32 for fp32), float32 (the\n"
    "                       checkpoint's values) or bfloat16 (rounded to nearest even)\n"
    "  --max-shard-size S   the most tensor bytes in one safetensors file (default 5GB; KB, MB,\n"
    "                       GB are powers of 1000, KiB, MiB, GiB of 1024)\n";

static const char help_calibrate[] =
    "Usage: wlbtrain calibrate --config FILE [--set KEY=VALUE]... --out PROFILE\n"
    "\n"
    "Times one layer of the config's model (its shapes, its TP split, train.precision) on the\n"
    "device of train.device (cpu or cuda): the layer's matrix products and element-wise work at\n"
    "micro-batches of 1/8 to 1 window (data.context_window), and attention forward and backward\n"
    "over windows of documents of one length (the kernel tile to the window) and of mixed lengths.\n"
    "Fits the cost model's rates (GEMM efficiency, element-wise GB/s, a fixed time per layer, the\n"
    "attention rate by query length) and writes them as a calibration profile, JSON version 2\n"
    "(docs/planner.md, \"Calibration\"); use it with --set balance.calibration=PROFILE in training\n"
    "and the dry run. Prints what it measured.\n"
    "\n"
    "Options:\n"
    "  --config FILE        the config whose model and device are measured\n"
    "  --set KEY=VALUE      override a config key (repeatable)\n"
    "  --out PROFILE        the profile to write (replaced only when complete)\n"
    "\n"
    "train.device: cuda without a GPU is an error (exit status 2).\n";

static const char help_eval[] =
    "Usage: wlbtrain eval --checkpoint PATH [--config FILE] [--set KEY=VALUE]... [--out FILE]\n"
    "       wlbtrain eval --init-from PATH --config FILE [--set KEY=VALUE]... [--out FILE]\n"
    "\n"
    "The validation loss of saved weights: the mean cross-entropy over the labelled tokens of the\n"
    "validation set (data.valid_path, or the documents data.valid_fraction holds out of data.path),\n"
    "the same batches a training run with that config evaluates (train.eval_tokens; docs/validation.md).\n"
    "Forward only, no optimizer state. One process, or under mpirun / srun on any layout.\n"
    "\n"
    "Options:\n"
    "  --checkpoint PATH    a checkpoint folder (checkpoint.dir: its latest is taken) or one of its\n"
    "                       step-NNNNNNNN folders; without --config its config.yaml is the config,\n"
    "                       with the layout reset to one process (or data-parallel over the launch)\n"
    "                       and train.init_from to none: --set parallel.tp=2 etc. for another layout\n"
    "  --init-from PATH     weights as train.init_from reads them: a Hugging Face model folder\n"
    "                       (config.json and its safetensors, such as wlbtrain export writes), one\n"
    "                       safetensors file with Hugging Face names, or a llama2.c checkpoint\n"
    "  --config FILE        the config (model shape, data, validation set); required with --init-from\n"
    "  --set KEY=VALUE      override a config key (repeatable), e.g. --set data.valid_path=PREFIX\n"
    "  --out FILE           also write the result as one JSON object (valid_loss with all its digits,\n"
    "                       as log.metrics has it)\n"
    "\n"
    "Prints the validation set, the record the checkpoint keeps of the run's last and best\n"
    "validation loss, and the loss measured now.\n";

void cli_print_help(const char *topic)
{
    if (topic && !strcmp(topic, "inspect"))
        fputs(help_inspect, stdout);
    else if (topic && !strcmp(topic, "convert"))
        fputs(help_convert, stdout);
    else if (topic && !strcmp(topic, "export"))
        fputs(help_export, stdout);
    else if (topic && !strcmp(topic, "calibrate"))
        fputs(help_calibrate, stdout);
    else if (topic && !strcmp(topic, "eval"))
        fputs(help_eval, stdout);
    else
        fputs(help_main, stdout);
}

void cli_print_version(void)
{
    char line[1024];
    printf("wlbtrain %s\n", WLB_VERSION);
    for (int i = 0; backend_at(i); i++) {
        backend_at(i)->describe(line, sizeof line);
        printf("backend %s: %s\n", backend_at(i)->name, line);
    }
    int mpi_major = 0, mpi_minor = 0;
    MPI_Get_version(&mpi_major, &mpi_minor);
    printf("libraries: Open MPI %d.%d.%d (MPI %d.%d), libyaml %s, zlib %s, jansson %s, PCRE2 %d.%d\n",
           OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION, mpi_major, mpi_minor,
           yaml_get_version_string(), zlibVersion(), jansson_version_str(), PCRE2_MAJOR, PCRE2_MINOR);
}
