#!/usr/bin/env bash
# check-shell.sh: shellcheck's errors and warnings over the shell scripts git tracks (the vet stage
# of `make test` runs it): each *.sh file and each file whose first line names sh or bash. Its
# notes of style are left to the reader. Outside a git checkout there is nothing to check.
set -euo pipefail
cd "$(dirname "$0")/.."
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || exit 0
command -v shellcheck >/dev/null || { echo "check-shell: shellcheck is missing: make deps installs it (Debian package shellcheck)" >&2; exit 1; }
scripts=()
while IFS= read -r -d '' f; do
	[ -f "$f" ] || continue # deleted in the work tree, not yet in the index
	if [[ $f == *.sh ]] || head -n 1 "$f" | grep -qE '^#!.*[/ ](ba)?sh( |$)'; then
		scripts+=("$f")
	fi
done < <(git ls-files -z)
[ ${#scripts[@]} -eq 0 ] && exit 0
# -x follows the files a script sources; their `shellcheck source=` paths are the repository's.
shellcheck -x --severity=warning "${scripts[@]}"
