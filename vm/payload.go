package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The guest's root file system is its initramfs, which the kernel unpacks
// into rootfs: a tmpfs (no root= on the command line, init/do_mounts.c
// init_rootfs) that may fill half of the memory not reserved when it is
// mounted (mm/shmem.c, shmem_default_max_blocks), and the initramfs image
// is still reserved then. An initramfs of S bytes in a guest of M bytes
// therefore unpacks only when S <= (M - K - S) / 2, that is 3S + K <= M,
// where K is what the kernel reserves for itself (its image and page
// tables; above 3 GiB a 64 MiB bounce buffer). Measured on 6.1 under qemu:
// K is 71 MiB at -m 1024, 88 at 2048, 188 at 4096, 226 at 6144; with
// -m 1024 an initramfs of 300 MiB booted and one of 330 MiB did not
// ("Initramfs unpacking failed: write error"). A guest that loses the end
// of its initramfs boots without it: no /init, or no kernel modules (their
// archive comes last) and "Cannot find device dummy0".

// Guest memory in MiB, as run-vm.sh takes RXE_MEM.
const (
	defaultGuestMem = 1024
	minGuestMem     = 256
)

const mib = 1 << 20

// headroom is what a guest of mem bytes needs besides three times its
// initramfs: K above, with 25 to 60 MiB to spare for the files a program
// writes under / and /tmp (the same tmpfs).
func headroom(mem int64) int64 { return 96*mib + mem/32 }

// guestBase is the part of every initramfs besides the payload and the
// large binaries guestOwn names: busybox, rdma-core's tools and provider,
// their libraries (6.6 MiB on Debian 12) and the kernel modules (2.5 MiB,
// 6.1), with room to spare.
const guestBase = 16 * mib

// guestMem returns the guest's memory in bytes: RXE_MEM (MiB) from extra
// (the last one wins) or the environment, else 1024 MiB.
func guestMem(extra []string) (int64, error) {
	s := lookupEnv(extra, "RXE_MEM")
	if s == "" {
		return defaultGuestMem * mib, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < minGuestMem || n > 1<<30 {
		return 0, fmt.Errorf("%w: RXE_MEM=%s: want the guest's memory in MiB, at least %d", ErrBadArgs, s, minGuestMem)
	}
	return n * mib, nil
}

// maxGuestCPUs is the most vCPUs RXE_SMP asks for: qemu's own limit for
// the default machine type (pc) is 255.
const maxGuestCPUs = 255

// checkGuestCPUs refuses, with an error wrapping ErrBadArgs, an RXE_SMP
// (the guest's vCPUs, 2 when unset) from extra or the environment that is
// not a count from 1 to maxGuestCPUs.
func checkGuestCPUs(extra []string) error {
	s := lookupEnv(extra, "RXE_SMP")
	if s == "" {
		return nil
	}
	if n, err := strconv.Atoi(s); err != nil || n < 1 || n > maxGuestCPUs {
		return fmt.Errorf("%w: RXE_SMP=%s: want the guest's vCPUs, 1 to %d", ErrBadArgs, s, maxGuestCPUs)
	}
	return nil
}

// lookupEnv returns the value of k in extra (KEY=VALUE, the last one
// wins), else in the environment.
func lookupEnv(extra []string, k string) string {
	for i := len(extra) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(extra[i], k+"="); ok {
			return v
		}
	}
	return os.Getenv(k)
}

// checkPayload refuses, with an error wrapping ErrBadArgs that gives the
// sizes, an initramfs of files (the command and --files, as the guest gets
// them), Python's standard library when python is set, and the guest's own
// part, that a guest with the memory extra and the environment give cannot
// unpack (3S + headroom <= M, above).
func checkPayload(files []string, python bool, extra []string) error {
	mem, err := guestMem(extra)
	if err != nil {
		return err
	}
	user := treeSize(files)
	if python {
		user += pythonSize()
	}
	own, ownWhat := guestOwn(extra)
	total := user + own
	need := 3*total + headroom(mem)
	if need <= mem {
		return nil
	}
	// The least RXE_MEM that holds it: m >= 3S + 96 MiB + m/32.
	fits := ((3*total+96*mib)*32/31 + mib - 1) / mib
	return fmt.Errorf("%w: the payload is %s (the command and --files %s, the guest's own %s: %s) and the guest has %s (RXE_MEM): "+
		"it needs 3 × %s + %s headroom = %s, since the kernel unpacks the payload into a tmpfs of half its memory (docs/VM.md); set RXE_MEM=%d or pass fewer files",
		ErrBadArgs, mibs(total), mibs(user), mibs(own), ownWhat, mibs(mem), mibs(total), mibs(headroom(mem)), mibs(need), fits)
}

// mibs formats bytes as MiB, rounded up.
func mibs(n int64) string { return fmt.Sprintf("%d MiB", (n+mib-1)/mib) }

// guestOwn returns the size of what stage.sh and build-initrd.sh put in
// every initramfs besides the payload (keep it in step with them), and
// what that is: guestBase, promtool when the host has it, and the running
// qpdrain when the guest creates rxe0 with it.
func guestOwn(extra []string) (int64, string) {
	n, what := int64(guestBase), []string{"busybox, rdma-core, libraries, modules"}
	if p, err := exec.LookPath("promtool"); err == nil {
		n += treeSize([]string{p})
		what = append(what, "promtool")
	}
	add := lookupEnv(extra, "RXE_ADD_CMD")
	if exe := qpdrainBin(); exe != "" && (add == "" || strings.HasPrefix(add, "qpdrain ")) {
		n += treeSize([]string{exe})
		what = append(what, "qpdrain")
	}
	return n, strings.Join(what, ", ")
}

// qpdrainBin is the running executable when it is the qpdrain CLI, the
// one program that can create rxe0 in the guest itself; "" otherwise.
func qpdrainBin() string {
	if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "qpdrain" {
		return exe
	}
	return ""
}

// pythonSize is the size of what --python brings: the interpreter and the
// standard library stage.sh copies (counted whole but for site-packages:
// a few MiB of tests and tools it leaves out count too).
func pythonSize() int64 {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, pythonBin, "-c", `import sysconfig; print(sysconfig.get_paths()["stdlib"])`).Output()
	n := treeSize([]string{pythonBin})
	if err != nil {
		return n // stage.sh says what is wrong with the host's Python
	}
	return n + treeSize([]string{strings.TrimSpace(string(out))}, "site-packages")
}

// treeSize is the size of the regular files under paths, symbolic links
// followed (as cp -rL copies them) and each directory counted once, but for
// directories named in skip. What cannot be read counts nothing: stage.sh
// reports it.
func treeSize(paths []string, skip ...string) int64 {
	seen := map[string]bool{}
	var size func(p string) int64
	size = func(p string) int64 {
		st, err := os.Stat(p)
		switch {
		case err != nil:
			return 0
		case st.Mode().IsRegular():
			return st.Size()
		case !st.IsDir():
			return 0
		}
		real, err := filepath.EvalSymlinks(p)
		if err != nil || seen[real] {
			return 0
		}
		seen[real] = true
		ents, err := os.ReadDir(p)
		if err != nil {
			return 0
		}
		var n int64
		for _, e := range ents {
			if e.IsDir() && slices.Contains(skip, e.Name()) {
				continue
			}
			n += size(filepath.Join(p, e.Name()))
		}
		return n
	}
	var n int64
	for _, p := range paths {
		n += size(p)
	}
	return n
}
