package plugin

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/yaml"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/version"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata, then fail so a re-record cannot pass silently")

// golden compares got with testdata/name; with -update it writes the file and fails.
func golden(t *testing.T, name, got string) {
	t.Helper()

	path := filepath.Join("testdata", name)

	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		t.Fatalf("updated %s: check the diff and run again without -update", path)
	}

	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file: run go test ./pkg/plugin -run %s -update", t.Name())
	assert.Equal(t, string(want), got)
}

type fakeMetrics struct {
	body string
	err  error
}

func (f fakeMetrics) Metrics(context.Context) ([]byte, error) { return []byte(f.body), f.err }

const removedAPIMetrics = `# TYPE apiserver_requested_deprecated_apis gauge
apiserver_requested_deprecated_apis{group="flowcontrol.apiserver.k8s.io",removed_release="1.32",resource="prioritylevelconfigurations",subresource="",version="v1beta3"} 1
`

// fixture is the 3 control plane + 2 worker cluster of the golden files.
func fixture() *discoverytest.Cluster {
	c := discoverytest.ThreePlusTwo().PDBFor("default", "web", 1, 2, map[string]string{"role": "web"})
	c.Node("cp-2").Registry = "registry.example.com:5000/mirror"
	c.Node("worker-2").Order = "1"

	for node, name := range map[string]string{"worker-1": "web-a", "worker-2": "web-b"} {
		c.Pod(node, "default", name, "ReplicaSet/web-5d4f").Labels["role"] = "web"
	}

	cache := c.Pod("worker-1", "default", "cache-0", "StatefulSet/cache")
	cache.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}

	return c
}

func fakeDeps(c *discoverytest.Cluster, talosErr error) deps {
	return deps{
		kube: func(*genericclioptions.ConfigFlags) (*kubeTarget, error) {
			return &kubeTarget{
				client:   c.Clientset(),
				endpoint: discoverytest.Endpoint,
				cluster:  "lab",
				metrics:  fakeMetrics{body: removedAPIMetrics},
			}, nil
		},
		talos: func(context.Context, TalosFlags) (discovery.TalosReader, error) {
			if talosErr != nil {
				return nil, talosErr
			}

			return c.Talos(), nil
		},
	}
}

func runWith(t *testing.T, d deps, args ...string) (stdout, stderr string, code int) {
	t.Helper()

	var out, errOut bytes.Buffer

	code = run(context.Background(), genericiooptions.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}, args, d)

	return out.String(), errOut.String(), code
}

func TestPlanKubernetesGolden(t *testing.T) {
	tests := []struct {
		name   string
		golden string
		args   []string
	}{
		{name: "table", golden: "plan-kubernetes.golden", args: []string{"plan", "kubernetes", "--to", "v1.36.3", "--max-unavailable", "2"}},
		{name: "json", golden: "plan-kubernetes-json.golden", args: []string{"plan", "kubernetes", "--to", "v1.36.3", "--max-unavailable", "2", "-o", "json"}},
		{name: "talos table", golden: "plan-talos.golden", args: []string{"plan", "talos", "--to", "v1.13.9"}},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fixture()
			if strings.Contains(tt.name, "talos") {
				for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1"} {
					c.Node(n).Talos = "v1.12.4"
				}
			}

			stdout, stderr, code := runWith(t, fakeDeps(c, nil), tt.args...)
			assert.Equal(t, ExitOK, code, stderr)
			assert.Empty(t, stderr)
			golden(t, tt.golden, stdout)
		})
	}
}

func TestPlanRefusesADrainThatWouldStop(t *testing.T) {
	c := fixture()
	c.Pod("worker-2", "default", "debug", "")

	stdout, stderr, code := runWith(t, fakeDeps(c, nil), "plan", "kubernetes", "--to", "v1.36.3")

	assert.Equal(t, ExitRefused, code)
	assert.Regexp(t, `\n  worker-2 +default/debug +BLOCKS +no-controller: no controller re-creates it`, stdout)
	assert.Regexp(t, `\ndrains +REFUSED +5 nodes, 3 pods to evict; would stop: worker-2: default/debug \(no-controller\)`, stdout)
	assert.Contains(t, stderr, "plan refused by drains")
}

func TestPlanYAMLIsTheSameDocument(t *testing.T) {
	args := []string{"plan", "kubernetes", "--to", "v1.36.3"}

	jsonOut, _, code := runWith(t, fakeDeps(fixture(), nil), append(args, "-o", "json")...)
	require.Equal(t, ExitOK, code)

	yamlOut, _, code := runWith(t, fakeDeps(fixture(), nil), append(args, "-o", "yaml")...)
	require.Equal(t, ExitOK, code)

	var fromJSON, fromYAML api.Plan

	require.NoError(t, yaml.Unmarshal([]byte(jsonOut), &fromJSON))
	require.NoError(t, yaml.Unmarshal([]byte(yamlOut), &fromYAML))
	assert.Equal(t, fromJSON, fromYAML)
	assert.Equal(t, "ichor.dev/v1alpha1", fromYAML.APIVersion)
	assert.Equal(t, "Plan", fromYAML.Kind)
	assert.Len(t, fromYAML.Stages, 4)
}

func TestPlanExitCodes(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		cluster  func(*discoverytest.Cluster)
		talosErr error
		code     int
		stderr   string
		stdout   string
	}{
		{
			name: "refused: skipped minor", args: []string{"plan", "kubernetes", "--to", "v1.37.0"},
			code: ExitRefused, stderr: "plan refused by version skew, talos pairing", stdout: "upgrade to 1.36 first",
		},
		{
			name: "refused: not Talos", args: []string{"plan", "kubernetes", "--to", "v1.36.3"},
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").OSImage = "Ubuntu 24.04" },
			code:    ExitRefused, stderr: "plan refused by talos nodes", stdout: `worker-1 runs "Ubuntu 24.04"`,
		},
		{
			name: "refused json still prints the document", args: []string{"plan", "kubernetes", "--to", "v1.37.0", "-o", "json"},
			code: ExitRefused, stdout: `"runnable": false`,
		},
		{name: "malformed version", args: []string{"plan", "kubernetes", "--to", "1.36"}, code: ExitError, stderr: `malformed version "1.36"`},
		{name: "missing --to", args: []string{"plan", "talos"}, code: ExitError, stderr: "--to is required"},
		{name: "bad output", args: []string{"plan", "kubernetes", "--to", "v1.36.3", "-o", "wide"}, code: ExitError, stderr: "pass -o json or -o yaml"},
		{
			name: "installer tag disagrees", args: []string{"plan", "talos", "--to", "v1.13.9", "--installer-image", "ghcr.io/siderolabs/installer:v1.13.8"},
			code: ExitError, stderr: `--installer-image "ghcr.io/siderolabs/installer:v1.13.8" is tagged v1.13.8 but --to is v1.13.9: make them agree`,
		},
		{
			name: "per-node installer tag disagrees", args: []string{"plan", "talos", "--to", "v1.13.9", "--installer-image", "worker-1=ghcr.io/siderolabs/installer:v1.13.8"},
			code: ExitError, stderr: "make them agree",
		},
		{
			name: "--installer-image for a node the cluster does not have", args: []string{"plan", "talos", "--to", "v1.13.9", "--installer-image", "worker-9=ghcr.io/siderolabs/installer:v1.13.9"},
			code: ExitError, stderr: `the cluster has no node "worker-9"`,
		},
		{
			name: "the installer flag is --installer-image", args: []string{"plan", "talos", "--to", "v1.13.9", "--image", "ghcr.io/siderolabs/installer:v1.13.9"},
			code: ExitError, stderr: "unknown flag: --image",
		},
		{
			name: "upgrade talos: --image is the Job's, not an installer", args: []string{"upgrade", "talos", "--to", "v1.14.1", "--image", "factory.talos.dev/metal-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.14.1"},
			code: ExitError, stderr: "is a Talos installer: --image is the kubectl-ichor image the Job runs; pass the installer with --installer-image",
		},
		{
			name: "talos unreachable", args: []string{"plan", "kubernetes", "--to", "v1.36.3"},
			talosErr: status.Error(codes.Unavailable, "connection refused"), code: ExitError, stderr: "connection refused",
		},
		{
			name: "bad order label", args: []string{"plan", "kubernetes", "--to", "v1.36.3"},
			cluster: func(c *discoverytest.Cluster) { c.Node("worker-1").Order = "x" },
			code:    ExitError, stderr: `node "worker-1": label ichor.dev/order="x" is not an integer`,
		},
		{name: "unknown flag", args: []string{"plan", "kubernetes", "--too", "v1"}, code: ExitError, stderr: "unknown flag"},
	}

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fixture()
			if tt.cluster != nil {
				tt.cluster(c)
			}

			stdout, stderr, code := runWith(t, fakeDeps(c, tt.talosErr), tt.args...)
			assert.Equal(t, tt.code, code, "stderr: %s", stderr)
			assert.Contains(t, stdout, tt.stdout)

			if tt.code != ExitOK {
				assert.Contains(t, stderr, tt.stderr)
				assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
			}
		})
	}
}

func TestDiscoveryErrorIsOneLine(t *testing.T) {
	d := fakeDeps(fixture(), nil)
	d.kube = func(*genericclioptions.ConfigFlags) (*kubeTarget, error) {
		return nil, errors.New("kubeconfig: no configuration has been provided: pass --kubeconfig or --context, or set KUBECONFIG")
	}

	_, stderr, code := runWith(t, d, "plan", "kubernetes", "--to", "v1.36.3")
	assert.Equal(t, ExitError, code)
	assert.Equal(t, "error: kubeconfig: no configuration has been provided: pass --kubeconfig or --context, or set KUBECONFIG\n", stderr)
}

func TestVersionAndHelp(t *testing.T) {
	stdout, _, code := runWith(t, deps{}, "version")
	assert.Equal(t, ExitOK, code)
	assert.Equal(t, version.Version+"\n", stdout)

	stdout, _, code = runWith(t, deps{}, "plan", "kubernetes", "--help")
	assert.Equal(t, ExitOK, code)
	assert.Contains(t, stdout, "kubectl ichor plan kubernetes --to vX.Y.Z")
	assert.Contains(t, stdout, "--talosconfig")
	assert.Contains(t, stdout, `(default "ichor-system")`)

	stdout, _, code = runWith(t, deps{}, "completion", "bash")
	assert.Equal(t, ExitOK, code)
	assert.Contains(t, stdout, "bash completion")
}
