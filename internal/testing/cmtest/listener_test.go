package cmtest

import (
	"flag"
	"net"
	"testing"

	"github.com/qpdrain/qpdrain/internal/testing/devtest"
)

// probeSIWListener runs TestListenerSurvivesEarlyClose on siw too, whose
// kernel the test may crash.
var probeSIWListener = flag.Bool("siw-listener-bug", false,
	"run TestListenerSurvivesEarlyClose on siw, where it may crash the kernel (docs/PROVIDERS.md)")

// earlyCloses is how many TCP connections TestListenerSurvivesEarlyClose
// closes at once: siw loses its listener to one in a few.
const earlyCloses = 50

// TestListenerSurvivesEarlyClose: TCP connections to an iWARP listener's
// port that close before they send an MPA request (a port scan, a client
// that gives up) leave the listener listening, and a connect through the
// CM afterwards is accepted. siw tears the listener down when such a
// connection closes before its CM work queue accepted it, and destroying
// the listener then corrupts a kernel list (docs/PROVIDERS.md): on siw
// the test runs only with -siw-listener-bug.
func TestListenerSurvivesEarlyClose(t *testing.T) {
	if !siw() {
		t.Skip("only a real iWARP device's listener is a TCP socket")
	}
	m, addr := Open(t)
	l, dst := listen(t, m, addr)
	// siw() is any real iWARP device; the device itself says whether it is siw.
	if devtest.SIW(t, l.Context()) && !*probeSIWListener {
		t.Skip("siw loses the listener, and its destroy then crashed Linux 6.12 (docs/PROVIDERS.md); -siw-listener-bug runs it")
	}
	for i := range earlyCloses {
		c, err := net.DialTimeout("tcp", dst.String(), devtest.Timeout)
		if err != nil {
			t.Fatalf("TCP connection %d to the listener's port %s: %v: the listener stopped listening after %d that closed before an MPA request", i+1, dst, err, i)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	_, _, done := connect(t, m, dst, devtest.Timeout)
	accept(t, l, 0, NewEndpoint)
	if err := <-done; err != nil {
		t.Fatalf("connect through the CM after %d TCP connections closed early: %v", earlyCloses, err)
	}
}
