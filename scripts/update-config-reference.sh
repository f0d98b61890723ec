#!/usr/bin/env bash
# Replaces the config reference in docs/configuration.md (between the config-reference markers)
# with the output of ./wlbtrain --help-config. Run after adding or changing a config key; a test
# (test/test_cli.c) fails until the page is current.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=$(./wlbtrain --help-config)
python3 - "$ref" <<'PY'
import sys
ref = sys.argv[1] + "\n"
page = "docs/configuration.md"
text = open(page).read()
begin, end = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"
a, b = text.index(begin) + len(begin), text.index(end)
open(page, "w").write(text[:a] + ref + text[b:])
PY
echo "docs/configuration.md: config reference updated"
