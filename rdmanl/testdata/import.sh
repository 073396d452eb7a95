#!/bin/sh
# import.sh FILE...: writes the nldev replies that TestKernelReplies printed
# inside the rxe VM (@@NLREC lines of .cache/rxe/run/<kernel>/result.txt, or
# of the output of make test-rxe, where each line starts with "[kernel] ")
# into testdata/<kernel>/<command>.hex and want.json, replacing what was there.
# From the repository root:
#   RXE_TEST_PKGS=./rdmanl RXE_TEST_ARGS='-test.run=^TestKernelReplies$' make test-rxe
#   rdmanl/testdata/import.sh .cache/rxe/run/*/result.txt
set -eu
dir=$(dirname "$0")
for f in "$@"; do
	tr -d '\r' <"$f" | awk -v dir="$dir" '
		{ i = index($0, "@@NLREC "); if (!i) next; $0 = substr($0, i) }
		$1 == "@@NLREC" {
			d = dir "/" $2
			if (!(d in made)) { made[d] = 1; system("rm -rf \"" d "\" && mkdir -p \"" d "\"") }
			if ($3 == "want") { sub(/^[^{]*/, ""); print > (d "/want.json"); next }
			print $4 > (d "/" $3 ".hex")
		}'
done
