package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const (
	exporterManifest = "qpdrain-exporter.yaml"
	leaksDoc         = "../docs/LEAKS.md"
	healthPath       = "/healthz"
)

// errUnknownKind is a document of a kind decode has no type for.
var errUnknownKind = errors.New("no type for this kind")

// decode decodes a multi-document manifest strictly into the Kubernetes
// API's types: an unknown or misspelt field, a duplicate field or a value
// of the wrong type is an error, as it is for the API server's strict
// field validation (kubectl apply --validate=strict).
func decode(b []byte) ([]any, error) {
	var out []any
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(b), -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		var obj any
		switch tm.APIVersion + " " + tm.Kind {
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "apps/v1 DaemonSet":
			obj = &appsv1.DaemonSet{}
		default:
			return nil, fmt.Errorf("document %d: %s %s: %w", i+1, tm.APIVersion, tm.Kind, errUnknownKind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, tm.Kind, err)
		}
		out = append(out, obj)
	}
	return out, nil
}

// TestDecodeStrict: the check rejects what the API server's strict
// validation would, so that a manifest it passes is of the schema.
func TestDecodeStrict(t *testing.T) {
	b, err := os.ReadFile(exporterManifest)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, from, to string }{
		{"misspelt field", "readinessProbe:", "readinesProbe:"},
		{"wrong type", "containerPort: 9879", `containerPort: "9879"`},
		{"duplicate field", "hostPID: true", "hostPID: true\n      hostPID: false"},
		{"unknown kind", "kind: ServiceAccount", "kind: ServiceAcount"},
	} {
		bad := strings.Replace(string(b), c.from, c.to, 1)
		if bad == string(b) {
			t.Fatalf("%s: %q is not in %s", c.name, c.from, exporterManifest)
		}
		if _, err := decode([]byte(bad)); err == nil {
			t.Errorf("%s (%q): decoded without an error", c.name, c.to)
		}
	}
}

// TestExporterManifest decodes the exporter's DaemonSet and ServiceAccount
// and holds what the schema cannot: the names that refer to each other,
// the probes on the exporter's own health endpoint in the scheme the
// scrape annotations give, a pinned image the docs name, and no device
// node a container that is not privileged could not open.
func TestExporterManifest(t *testing.T) {
	b, err := os.ReadFile(exporterManifest)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decode(b)
	if err != nil {
		t.Fatalf("%s: %v", exporterManifest, err)
	}
	var ds *appsv1.DaemonSet
	accounts := map[string]*corev1.ServiceAccount{}
	for _, o := range objs {
		switch o := o.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ServiceAccount:
			accounts[o.Name] = o
		}
	}
	if ds == nil {
		t.Fatalf("%s has no DaemonSet", exporterManifest)
	}
	pod := ds.Spec.Template
	for k, v := range ds.Spec.Selector.MatchLabels {
		if pod.Labels[k] != v {
			t.Errorf("the selector's %s=%s is not a label of the pod template", k, v)
		}
	}
	sa := accounts[pod.Spec.ServiceAccountName]
	switch {
	case sa == nil:
		t.Errorf("serviceAccountName %q is not a ServiceAccount of %s", pod.Spec.ServiceAccountName, exporterManifest)
	case sa.Namespace != ds.Namespace:
		t.Errorf("ServiceAccount in %q, DaemonSet in %q", sa.Namespace, ds.Namespace)
	case sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken,
		pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken:
		t.Error("the ServiceAccount's token is mounted: the exporter never talks to the API server")
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers, want the exporter alone", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	checkImage(t, c.Image)
	ann := pod.Annotations
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ann["prometheus.io/scrape"] != "true" || ann["prometheus.io/port"] != strconv.Itoa(int(ports["metrics"])) {
		t.Errorf("scrape annotations %v, want scrape and the metrics port %d", ann, ports["metrics"])
	}
	if want := telemetryPath(c.Args); ann["prometheus.io/path"] != want {
		t.Errorf("prometheus.io/path %q, the exporter serves %s", ann["prometheus.io/path"], want)
	}
	scheme := ann["prometheus.io/scheme"]
	if tls := slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--web.config.file") }); (scheme == "https") != tls {
		t.Errorf("prometheus.io/scheme %q with --web.config.file given %v: TLS and the scheme disagree", scheme, tls)
	}
	for name, p := range map[string]*corev1.Probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: want an httpGet probe", name)
		case p.HTTPGet.Path != healthPath:
			t.Errorf("%s on %s, want the exporter's %s", name, p.HTTPGet.Path, healthPath)
		case ports[p.HTTPGet.Port.String()] == 0:
			t.Errorf("%s on port %s, which the container does not name", name, p.HTTPGet.Port.String())
		case !strings.EqualFold(string(p.HTTPGet.Scheme), scheme):
			t.Errorf("%s scheme %q, the scrape's %q", name, p.HTTPGet.Scheme, scheme)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = v
	}
	privileged := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
	for _, m := range c.VolumeMounts {
		v, ok := volumes[m.Name]
		switch {
		case !ok:
			t.Errorf("volumeMount %s names no volume", m.Name)
		case !privileged && v.HostPath != nil && (v.HostPath.Path == "/dev" || strings.HasPrefix(v.HostPath.Path, "/dev/")):
			t.Errorf("volume %s mounts %s, whose devices the device cgroup keeps a container that is not privileged from opening: ask a device plugin for them", m.Name, v.HostPath.Path)
		}
	}
}

// checkImage wants a tag other than latest, and the docs to name it.
func checkImage(t *testing.T, image string) {
	t.Helper()
	name, tag, ok := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	if !ok || tag == "" || tag == "latest" {
		t.Errorf("image %s: pin a version tag (%s without one pulls whatever was pushed last)", image, name)
	}
	doc, err := os.ReadFile(leaksDoc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, []byte(image)) {
		t.Errorf("%s does not name the image %s", leaksDoc, image)
	}
}

// telemetryPath is the exporter's --web.telemetry-path among args, else
// its default.
func telemetryPath(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--web.telemetry-path="); ok {
			return v
		}
		if a == "--web.telemetry-path" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return "/metrics"
}
