#!/usr/bin/env bash
# No build output in the repository: fails on any tracked file over 1 MB and on
# any tracked executable binary (ELF, Mach-O or PE, whatever its name or mode).
set -o errexit -o nounset -o pipefail
cd "$(dirname "$0")/.."
limit=$((1024 * 1024))
bad=()
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue # deleted in the work tree, not yet committed
  size=$(stat -c %s "$f")
  if [ "$size" -gt "$limit" ]; then
    bad+=("$f: $size bytes (over 1 MB)")
    continue
  fi
  magic=$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')
  case "$magic" in
  7f454c46) bad+=("$f: an ELF executable") ;;
  cffaedfe | cefaedfe | feedfacf | feedface | cafebabe) bad+=("$f: a Mach-O executable") ;;
  4d5a*) bad+=("$f: a PE (Windows) executable") ;;
  esac
done < <(git ls-files -z)
if [ ${#bad[@]} -gt 0 ]; then
  echo "verify: build output is tracked (git rm --cached it; .gitignore keeps it out):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
