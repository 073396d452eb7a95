package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// qemuBin is the qemu the scripts run, looked up in PATH.
const qemuBin = "qemu-system-x86_64"

// kvmKey identifies what a KVM failure depends on: the host's kernel
// release, a space, the qemu binary that failed (its resolved path), a tab
// and its version line. (The release leads, followed by a space, as in the
// records of older qpdrain binaries, which read only it.) Another qemu, a
// qemu upgrade or another host kernel gives another key, so KVM is tried
// again there. A qemu not installed yet (the scripts install it) gives a
// key no record matches.
func kvmKey() string {
	rel := readLine("/proc/sys/kernel/osrelease")
	path, err := exec.LookPath(qemuBin)
	if err != nil {
		return rel + " " + qemuBin + " not found\t"
	}
	if p, err := filepath.EvalSymlinks(path); err == nil {
		path = p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, path, "--version").Output()
	ver, _, _ := strings.Cut(string(out), "\n")
	return rel + " " + path + "\t" + strings.TrimSpace(ver)
}

// kvmRecordFile is the cache's record of KVM failures, one line each:
// the key (kvmKey) and qemu's message, tab-separated.
func kvmRecordFile(cache string) string { return filepath.Join(cache, "kvm-broken") }

// kvmBroken returns qemu's message recorded in the cache when KVM passed the
// probe but qemu could not start a guest with it, for key only (kvmKey), with
// where it is recorded; "" when there is no such record.
func kvmBroken(cache, key string) string {
	b, err := os.ReadFile(kvmRecordFile(cache))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, msg, ok := cutKey(line); ok && k == key {
			return msg + "; recorded in " + kvmRecordFile(cache) + ", --accel kvm tries KVM"
		}
	}
	return ""
}

// cutKey splits a record line into its key (kvmKey) and message.
func cutKey(line string) (key, msg string, ok bool) {
	f := strings.SplitN(line, "\t", 3)
	if len(f) != 3 {
		return "", "", false
	}
	return f[0] + "\t" + f[1], f[2], true
}

// keyQEMU returns the qemu binary of a key.
func keyQEMU(key string) string {
	head, _, _ := strings.Cut(key, "\t")
	_, path, _ := strings.Cut(head, " ")
	return path
}

// recordKVMBroken records msg for key, replacing the key's old record and
// dropping the records of qemu binaries that no longer exist (a test's fake
// qemu, a qemu removed), so that the file stays small. The caller holds the
// cache lock; the file is replaced whole, so a reader never sees half of it.
func recordKVMBroken(cache, key, msg string) error {
	var keep []string
	b, err := os.ReadFile(kvmRecordFile(cache))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reading the KVM record: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, _, ok := cutKey(line)
		if !ok || k == key {
			continue
		}
		if _, err := os.Stat(keyQEMU(k)); err == nil {
			keep = append(keep, line)
		}
	}
	msg = strings.Join(strings.Fields(msg), " ") // one line
	keep = append(keep, key+"\t"+msg)
	tmp := kvmRecordFile(cache) + ".new"
	if err := os.WriteFile(tmp, []byte(strings.Join(keep, "\n")+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing the KVM record: %w", err)
	}
	if err := os.Rename(tmp, kvmRecordFile(cache)); err != nil {
		return fmt.Errorf("writing the KVM record: %w", err)
	}
	return nil
}
