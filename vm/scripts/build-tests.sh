#!/usr/bin/env bash
# build-tests.sh OUTDIR: builds the test binary of every package in RXE_PKGS (directories as go test
# takes them: ./x, ./x/..., ./...) of the Go module that holds the current directory, on the host
# (`go test -c`, cgo as the build has it), into OUTDIR/NAME.test, with OUTDIR/NAME.dir (the
# package's directory relative to the module root, where the binary runs in the guest, as go test
# does) and a copy of each package's files and testdata/ (and the module's testdata/) under
# OUTDIR/src. OUTDIR/pkgs lists the NAMEs built, OUTDIR/skipped the listed packages that are not in
# the tree or have no tests (a pattern with ... skips packages without tests silently).
# RXE_GO_TEST_FLAGS adds flags to go test -c (e.g. -race).
set -euo pipefail
# shellcheck source=vm/scripts/lib.sh disable=SC1091
. "$(dirname "$0")/lib.sh"

out=$(realpath -m "${1:?usage: build-tests.sh OUTDIR}")
rm -rf "$out" && mkdir -p "$out/src"
: >"$out/pkgs"
: >"$out/skipped"
read -ra flags <<<"${RXE_GO_TEST_FLAGS:-}"
command -v go >/dev/null || rxe_env_die "go is not on PATH (qpdrain vm go-test builds the tests with it)"
mod=$(go env GOMOD)
[ -n "$mod" ] && [ "$mod" != /dev/null ] || rxe_die "$(pwd) is not inside a Go module (go env GOMOD is empty)"
root=$(dirname "$mod")
[ -d "$root/testdata" ] && cp -r "$root/testdata" "$out/src/testdata"

# build DIR: one package, DIR absolute
build() {
	local dir=$1 rel name
	rel=$(realpath --relative-to="$root" "$dir")
	name=${rel//\//_}
	[ "$rel" = . ] && name=_root_
	grep -qx "$name" "$out/pkgs" && return 0
	rxe_log "go test -c ${flags[*]} ./$rel"
	(cd "$root" && go test -c "${flags[@]}" -o "$out/$name.test" "./$rel") || rxe_die "go test -c ./$rel failed"
	[ -x "$out/$name.test" ] || rxe_die "go test -c ./$rel produced no binary"
	echo "$rel" >"$out/$name.dir"
	# the package's own files (tests may read them) and its testdata/
	mkdir -p "$out/src/$rel"
	find "$dir" -maxdepth 1 -type f -exec cp {} "$out/src/$rel/" \;
	[ -d "$dir/testdata" ] && cp -r "$dir/testdata" "$out/src/$rel/testdata"
	echo "$name" >>"$out/pkgs"
}

for pkg in $RXE_PKGS; do
	case $pkg in
	*...*)
		# every package the pattern matches that has tests
		# shellcheck disable=SC2016 # go list's template
		list=$(go list -f '{{.Dir}} {{len .TestGoFiles}} {{len .XTestGoFiles}}' "$pkg") ||
			rxe_die "go list $pkg failed"
		while read -r dir n x; do
			[ $((n + x)) -gt 0 ] && build "$dir"
		done <<<"$list"
		;;
	*)
		if [ ! -d "$pkg" ]; then
			rxe_log "ERROR: $pkg is not a directory in the tree: skipped"
			echo "$pkg (not in the tree)" >>"$out/skipped"
			continue
		fi
		if ! compgen -G "$pkg/*_test.go" >/dev/null; then
			rxe_log "ERROR: $pkg has no _test.go files: skipped"
			echo "$pkg (no test files)" >>"$out/skipped"
			continue
		fi
		build "$(realpath "$pkg")"
		;;
	esac
done
