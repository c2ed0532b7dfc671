#!/usr/bin/env bash
# The README's code block marked <!-- snippet: NAME --> must be the region
# between `/// [NAME]` lines of the example it quotes, so the docs cannot rot.
#   check_snippet.sh README EXAMPLE NAME
set -euo pipefail
readme=$1 example=$2 name=$3
want=$(awk -v n="$name" '$0 ~ "/// \\[" n "\\]" {on = !on; next} on' "$example")
got=$(awk -v n="$name" '$0 ~ "<!-- snippet: " n " -->" {on = 1; next}
                        $0 ~ "<!-- /snippet -->" {on = 0} on && !/^```/' "$readme")
if [ -z "$want" ] || [ "$want" != "$got" ]; then
  echo "README snippet '$name' differs from $example:" >&2
  diff <(echo "$want") <(echo "$got") >&2 || true
  exit 1
fi
echo "snippet '$name' matches"
