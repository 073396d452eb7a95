package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/crypto/bcrypt"

	"github.com/qpdrain/qpdrain/internal/testing/promcheck"
	"github.com/qpdrain/qpdrain/internal/testing/syncbuf"
	"github.com/qpdrain/qpdrain/leaks"
	"github.com/qpdrain/qpdrain/workload"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// into dir, returning their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "qpdrain test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, b := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: kder}} {
		writeFile(t, path, string(pem.EncodeToMemory(b)))
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// TestExporterTLSBasicAuth serves the exporter over TLS with basic auth
// from a web config file, as Prometheus documents it, and scrapes it:
// with the password it serves the metrics (a pod's QPs among them) and the
// landing page; without it, with a wrong one, or over plain HTTP it does
// not.
func TestExporterTLSBasicAuth(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, pool := selfSigned(t, dir)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	config := writeFile(t, filepath.Join(dir, "web.yml"), "tls_server_config:\n  cert_file: "+certFile+"\n  key_file: "+keyFile+
		"\nbasic_auth_users:\n  prometheus: "+string(hash)+"\n")
	f := leakyHost(100)
	pod := workload.Parse(testPodCg)
	base := f.qps
	f.qps = func(i int) []leaks.QP {
		qps := base(i)
		for j := range qps {
			if qps[j].Owner.PID != 0 {
				qps[j].Owner.Workload = &pod
			}
		}
		return qps
	}
	useHost(t, f)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	opts := &globalOptions{logFormat: "text"}
	opts.log = newLogger(io.Discard, logrus.WarnLevel, "text")
	var stderr syncbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- serveExporter(ctx, []net.Listener{ln}, &stderr, opts, &exporterOptions{
			listen: []string{addr}, telemetryPath: "/metrics", webConfig: config,
			window: time.Minute, nearLimit: 0.9, host: hostOptions{timeout: time.Second}})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("exporter: %v", err)
		}
	}()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(url, user, pass string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	https := "https://" + addr
	var body string
	for range 2 {
		code, b := get(https+"/metrics", "prometheus", "s3cret")
		if code != http.StatusOK {
			t.Fatalf("GET /metrics with basic auth: %d %s", code, b)
		}
		body = b
	}
	for _, want := range []string{"qpdrain_scrape_success 1",
		`qpdrain_workload_qps{cgroup="/kubepods.slice",device="rxe0",pod_uid="` + testPodUID + `",state="ERR"} 2`,
		`qpdrain_workload_leak_qps{cgroup="/kubepods.slice",device="rxe0",pod_uid="` + testPodUID + `",reason="stuck-in-error"} 2`} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	promcheck.Check(t, []byte(body))
	if code, page := get(https+"/", "prometheus", "s3cret"); code != http.StatusOK || !strings.Contains(page, "qpdrain exporter") || !strings.Contains(page, `href="/metrics"`) {
		t.Errorf("landing page: %d\n%s", code, page)
	}
	// The health endpoint is behind the same authentication: a probe
	// needs the credentials (deploy/qpdrain-exporter.yaml says so).
	if code, b := get(https+healthPath, "prometheus", "s3cret"); code != http.StatusOK || b != "ok\n" {
		t.Errorf("GET %s with basic auth: %d %q", healthPath, code, b)
	}
	for _, c := range []struct{ user, pass string }{{"", ""}, {"prometheus", "wrong"}, {"nobody", "s3cret"}} {
		for _, path := range []string{"/metrics", healthPath} {
			if code, _ := get(https+path, c.user, c.pass); code != http.StatusUnauthorized {
				t.Errorf("GET %s as %q/%q: %d, want 401", path, c.user, c.pass, code)
			}
		}
	}
	if code, b := get("http://"+addr+"/metrics", "prometheus", "s3cret"); code == http.StatusOK {
		t.Errorf("plain HTTP to the TLS port served: %s", b)
	}
	// net/http logs the plain-HTTP request on its own goroutine, after
	// the client may have read the answer: wait for the line, bounded.
	log := stderr.String()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(log, "client sent an HTTP request to an HTTPS server") && time.Now().Before(deadline); log = stderr.String() {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(log, `msg="Listening on" address=`+addr) || !strings.Contains(log, "TLS is enabled") ||
		!strings.Contains(log, "client sent an HTTP request to an HTTPS server") {
		t.Errorf("no startup line with the address and TLS, or no line for the plain-HTTP request:\n%s", log)
	}
}

// TestExporterFlags: the Prometheus exporters' flag names, --listen as
// their alias, and the errors of bad values before anything is served.
func TestExporterFlags(t *testing.T) {
	cmd := newExporterCmd(&globalOptions{})
	if err := cmd.ParseFlags([]string{"--listen", "127.0.0.1:1", "--web.listen-address", "[::1]:2", "--web.telemetry-path", "/m"}); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("web.listen-address").Value.String(); got != "[127.0.0.1:1,[::1]:2]" {
		t.Errorf("--web.listen-address after --listen and --web.listen-address: %s", got)
	}
	if def := newExporterCmd(&globalOptions{}).Flags().Lookup("web.listen-address").DefValue; def != "[:9879]" {
		t.Errorf("default listen address %s", def)
	}
	testExporterBadFlags(t)
}

// TestDaemonSetArgs: the DaemonSet's arguments are the exporter's.
func TestDaemonSetArgs(t *testing.T) {
	ds, err := os.ReadFile("../../deploy/qpdrain-exporter.yaml")
	if errors.Is(err, fs.ErrNotExist) && os.Getenv("QPDRAIN_TEST_DEVICE") != "" && !strings.HasPrefix(os.Getenv("QPDRAIN_TEST_DEVICE"), "soft") {
		// The VM holds the test binary, not the repository: the host's run checks it.
		t.Skipf("no deploy/ beside the test binary on %s", os.Getenv("QPDRAIN_TEST_DEVICE"))
	}
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`args: \[("exporter"[^\]]*)\]`).FindSubmatch(ds)
	if m == nil {
		t.Fatal("deploy/qpdrain-exporter.yaml has no exporter args")
	}
	var args []string
	if err := json.Unmarshal([]byte("["+string(m[1])+"]"), &args); err != nil {
		t.Fatal(err)
	}
	if err := newExporterCmd(&globalOptions{}).ParseFlags(args[1:]); err != nil {
		t.Errorf("the DaemonSet's args %q: %v", args, err)
	}
}

// testExporterBadFlags: each bad value is refused before a listener opens
// or the host is read: exit 2, where a valid set would get as far as
// finding no RDMA here (exit 3).
func testExporterBadFlags(t *testing.T) {
	bad := writeFile(t, filepath.Join(t.TempDir(), "web.yml"), "tls_server_config:\n  cert_file: /no/such/cert.pem\n")
	wantRefused(t, []string{"exporter", "--web.listen-address", "127.0.0.1:1"}, []badInput{
		{[]string{"--web.telemetry-path", "/"}, exitError, "--web.telemetry-path"},
		{[]string{"--web.telemetry-path", "metrics"}, exitError, "--web.telemetry-path"},
		{[]string{"--web.telemetry-path", healthPath}, exitError, "--web.telemetry-path"},
		{[]string{"--near-limit", "2"}, exitError, "--near-limit"},
		{[]string{"--web.config.file", bad}, exitError, "--web.config.file " + bad},
		{[]string{"--web.config.file", filepath.Join(t.TempDir(), "missing.yml")}, exitError, "--web.config.file"},
	})
}
