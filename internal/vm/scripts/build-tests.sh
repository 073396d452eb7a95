#!/usr/bin/env bash
# build-tests.sh OUTDIR: builds the test binary of every package in RXE_TEST_PKGS on the host
# (`go test -c`, cgo as the build has it) into OUTDIR/NAME.test, with OUTDIR/NAME.dir (the package's
# directory, where the binary runs in the guest, as go test does) and a copy of each package's
# files and testdata/ (and the module's testdata/) under OUTDIR/src. OUTDIR/pkgs lists the NAMEs
# built, OUTDIR/skipped the listed packages not in the tree.
# RXE_GO_TEST_FLAGS adds flags to go test -c (e.g. -race).
set -euo pipefail
# shellcheck source=scripts/rxe/common.sh disable=SC1091
. "$(dirname "$0")/common.sh"

out=$(realpath -m "${1:?usage: build-tests.sh OUTDIR}")
rm -rf "$out" && mkdir -p "$out/src"
: >"$out/pkgs"
: >"$out/skipped"
read -ra flags <<<"${RXE_GO_TEST_FLAGS:-}"
cd "$RXE_ROOT"
[ -d testdata ] && cp -r testdata "$out/src/testdata"
for pkg in $RXE_TEST_PKGS; do
	rel=${pkg#./}
	rel=${rel%/}
	name=${rel//\//_}
	if [ ! -d "$rel" ]; then
		rxe_log "ERROR: RXE_TEST_PKGS lists $pkg, which is not in the tree: skipped"
		echo "$pkg (not in the tree)" >>"$out/skipped"
		continue
	fi
	if ! compgen -G "$rel/*_test.go" >/dev/null; then
		rxe_log "ERROR: RXE_TEST_PKGS lists $pkg, which has no _test.go files: skipped"
		echo "$pkg (no test files)" >>"$out/skipped"
		continue
	fi
	rxe_log "go test -c ${flags[*]} ./$rel"
	go test -c "${flags[@]}" -o "$out/$name.test" "./$rel" || rxe_die "go test -c ./$rel failed"
	[ -x "$out/$name.test" ] || rxe_die "go test -c ./$rel produced no binary"
	echo "$rel" >"$out/$name.dir"
	# the package's own files (tests may read them) and its testdata/
	mkdir -p "$out/src/$rel"
	find "$rel" -maxdepth 1 -type f -exec cp {} "$out/src/$rel/" \;
	[ -d "$rel/testdata" ] && cp -r "$rel/testdata" "$out/src/$rel/testdata"
	echo "$name" >>"$out/pkgs"
done
