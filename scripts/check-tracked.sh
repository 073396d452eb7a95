#!/usr/bin/env bash
# check-tracked.sh: fails when git tracks a build output: an ELF file, or any file over 1 MB (the
# vet stage of `make test` runs it). Binaries belong to .gitignore, not to the repository. Outside
# a git checkout there is nothing to check.
set -euo pipefail
cd "$(dirname "$0")/.."
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0
bad=0
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue # deleted in the work tree, not yet in the index
	if [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
		echo "tracked ELF binary: $f (git rm --cached it; .gitignore it)"
		bad=1
	elif [ "$(stat -c %s "$f")" -gt 1048576 ]; then
		echo "tracked file over 1 MB: $f ($(stat -c %s "$f") bytes)"
		bad=1
	fi
done < <(git ls-files -z)
exit "$bad"
