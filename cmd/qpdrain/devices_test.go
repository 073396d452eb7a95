package main

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/qpdrain/qpdrain/ibv"
)

// TestDevices runs "qpdrain devices" on whatever this machine has: without
// RDMA it must say "no RDMA devices" (and why, when libibverbs is missing)
// and exit 3; with devices (inside the
// rxe VM) it must list each, in text and in JSON.
func TestDevices(t *testing.T) {
	infos, listErr := ibv.Devices()
	stdout, err := runSub("devices")
	if listErr != nil || len(infos) == 0 {
		want := "no RDMA devices"
		if why := noLibibverbs(); why != "" {
			want += ": " + why
		}
		var ec *exitCodeError
		if !errors.As(err, &ec) || ec.code != exitUnsupported || err.Error() != want {
			t.Fatalf("devices without RDMA: err %v, want %q with exit code %d", err, want, exitUnsupported)
		}
		// -j prints the error document, as every command does
		// (TestContractBadInputs).
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range infos {
		if !strings.Contains(stdout, info.Name+": ") || !strings.Contains(stdout, "port 1 state") {
			t.Errorf("output does not list %s and its port 1:\n%s", info.Name, stdout)
		}
	}
	if stdout, err = runSub("devices", "-j"); err != nil {
		t.Fatal(err)
	}
	var devs []deviceReport
	if err := json.Unmarshal([]byte(stdout), &devs); err != nil {
		t.Fatalf("JSON output: %v\n%s", err, stdout)
	}
	if len(devs) != len(infos) || len(devs[0].Ports) == 0 {
		t.Errorf("JSON lists %d devices, want %d with ports:\n%s", len(devs), len(infos), stdout)
	}
	t.Logf("%s", stdout)
}

// Without a PCI inventory (ghw failed, or found nothing) a device's PCI
// function is still reported by its address.
func TestPCIFunctionWithoutInventory(t *testing.T) {
	got := pciFunction(nil, "0000:3b:00.0")
	if got == nil || *got != (pciReport{Address: "0000:3b:00.0"}) {
		t.Errorf("pciFunction = %+v, want the address alone", got)
	}
}
