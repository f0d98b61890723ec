#!/usr/bin/env bash
# Replaces the config reference in README.md (between the config-reference markers) with the
# output of ./wlbtrain --help-config. Run after adding or changing a config key; a test fails
# until the README is current.
set -euo pipefail
cd "$(dirname "$0")/.."
ref=$(./wlbtrain --help-config)
python3 - "$ref" <<'PY'
import sys
ref = sys.argv[1] + "\n"
text = open("README.md").read()
begin, end = "<!-- config-reference:begin -->\n", "<!-- config-reference:end -->"
a, b = text.index(begin) + len(begin), text.index(end)
open("README.md", "w").write(text[:a] + ref + text[b:])
PY
echo "README.md: config reference updated"
