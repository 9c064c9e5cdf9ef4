//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
)

// env returns a required environment variable or fails the test with what
// to do.
func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("$%s is not set: run the local-cluster tests with make test (or make e2e)", name)
	}
	return v
}

// Cluster is a running local cluster.
type Cluster struct {
	Dir         string
	Kubeconfig  string
	Talosconfig string
	Info        cluster.Info
	Client      kubernetes.Interface
}

// Machine returns the named machine's info.
func (c *Cluster) Machine(t *testing.T, name string) cluster.MachineInfo {
	t.Helper()
	for _, m := range c.Info.Machines {
		if m.Name == name {
			return m
		}
	}
	t.Fatalf("no machine %s in the cluster", name)
	return cluster.MachineInfo{}
}

// Events reads the cluster's events.jsonl.
func (c *Cluster) Events(t *testing.T) []events.Event {
	t.Helper()
	ev, err := events.Read(filepath.Join(c.Dir, cluster.EventsFile))
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// startCluster starts a local cluster for the test with ichor-sim up and the
// given flags, and stops it when the test ends, keeping its logs if the test
// failed.
func startCluster(t *testing.T, args ...string) *Cluster {
	t.Helper()
	sim := env(t, "ICHOR_SIM")
	dir, err := os.MkdirTemp("", "ichor-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	full := append([]string{"up", "--dir", dir, "--bin-dir", env(t, "ICHOR_CLUSTER_BINS")}, args...)
	out, err := exec.Command(sim, full...).CombinedOutput()
	t.Cleanup(func() {
		if t.Failed() {
			saveArtifacts(t, dir)
		}
		if out, err := exec.Command(sim, "down", "--dir", dir).CombinedOutput(); err != nil {
			t.Errorf("ichor-sim down: %v\n%s", err, out)
		}
		_ = os.RemoveAll(dir)
	})
	if err != nil {
		t.Fatalf("ichor-sim up: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	c := &Cluster{Dir: dir, Kubeconfig: filepath.Join(dir, cluster.KubeconfigFile), Talosconfig: filepath.Join(dir, cluster.TalosconfigFile)}
	b, err := os.ReadFile(filepath.Join(dir, cluster.ReadyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &c.Info); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	c.Client = kubernetes.NewForConfigOrDie(cfg)
	return c
}

func saveArtifacts(t *testing.T, dir string) {
	root := os.Getenv("ICHOR_E2E_ARTIFACTS")
	if root == "" {
		return
	}
	dst := filepath.Join(root, strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
	_ = os.RemoveAll(dst)
	_ = os.MkdirAll(dst, 0o755)
	for _, p := range []string{cluster.LogDir, cluster.EventsFile} {
		_ = exec.Command("cp", "-r", filepath.Join(dir, p), dst).Run()
	}
	t.Logf("cluster logs kept in %s", dst)
}

// kubectl runs the kubectl built with the control plane against c.
func (c *Cluster) kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(env(t, "ICHOR_CLUSTER_BINS"), "kubectl")
	cmd := exec.Command(bin, append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// eventually polls cond until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		if last = cond(ctx); last == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not true after %s: %v", what, timeout, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}
