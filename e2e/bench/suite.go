package main

// suite.go is what every benchmark shares: the sizes measured in turn, a
// local cluster started, settled and stopped for each measurement (its logs
// kept when it failed), and the report written as NAME.json and NAME.txt.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
)

// suite is one benchmark over cluster sizes. measure measures one size (it
// starts the clusters it needs with withCluster) into one or more results;
// failure says why a result was not measured ("" when it was), naming it;
// report makes the document written as NAME.json and its text summary.
type suite[R any] struct {
	name    string
	sizes   []int
	measure func(ctx context.Context, n int) []R
	failure func(R) (what, err string)
	report  func(results []R) (doc any, summary func(io.Writer))
}

// run measures every size (stopping early when interrupted) and writes the
// report in out, whatever was measured. It fails when a result was not.
func (s suite[R]) run(ctx context.Context, out string) error {
	var (
		results []R
		failed  []string
	)
	for _, n := range s.sizes {
		for _, r := range s.measure(ctx, n) {
			if what, err := s.failure(r); err != "" {
				failed = append(failed, fmt.Sprintf("%s: %s", what, err))
				fmt.Fprintf(os.Stderr, "bench: %s %s: %s\n", s.name, what, err)
			}
			results = append(results, r)
		}
		if ctx.Err() != nil {
			break
		}
	}
	doc, summary := s.report(results)
	if err := writeReport(out, s.name, doc, summary); err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("%s not measured: %s", s.name, strings.Join(failed, "; "))
	}
	return nil
}

// writeReport writes out/NAME.json and out/NAME.txt and prints the summary.
func writeReport(out, name string, doc any, summary func(io.Writer)) error {
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	jsonPath, txtPath := filepath.Join(out, name+".json"), filepath.Join(out, name+".txt")
	if err := os.WriteFile(jsonPath, append(b, '\n'), 0o644); err != nil {
		return err
	}
	var text bytes.Buffer
	summary(&text)
	if err := os.WriteFile(txtPath, text.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Print(text.String())
	fmt.Printf("\nwritten: %s, %s\n", jsonPath, txtPath)
	return nil
}

// simCluster is a local cluster started for one measurement.
type simCluster struct {
	dir, kubeconfig, talosconfig string
	// home is an empty HOME for the commands measured.
	home string
	// startSeconds is how long ichor-sim up took.
	startSeconds float64
	// info is its ready.json: the machines' names and addresses.
	info cluster.Info
}

// clusterRun says how to start a cluster: what (for the progress lines),
// the nodes (3 of them control planes), its Kubernetes and Talos versions
// (the benchmark's fromVersion and talosVersion when empty), ichor-sim up's
// flags beyond the size, versions and directory, and where to keep its logs
// (a directory under --out) when the measurement fails, or always when keep
// is set.
type clusterRun struct {
	what              string
	nodes             int
	kubernetes, talos string
	flags             []string
	logs              string
	keep              bool
}

// withCluster starts the cluster, waits until it has settled and calls f
// with it; it stops the cluster whatever happened, keeping its logs first
// when the start or f failed.
func withCluster(ctx context.Context, o options, cr clusterRun, f func(c *simCluster) error) (err error) {
	fmt.Fprintf(os.Stderr, "bench: %s: starting a cluster of %d control planes and %d workers\n", cr.what, controlPlanes, cr.nodes-controlPlanes)

	dir, err := os.MkdirTemp("", "ichor-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	kube, talos := cmp.Or(cr.kubernetes, fromVersion), cmp.Or(cr.talos, talosVersion)
	start := time.Now()
	args := append([]string{"up", "--dir", dir, "--bin-dir", o.binDir,
		"--control-planes", strconv.Itoa(controlPlanes), "--workers", strconv.Itoa(cr.nodes - controlPlanes),
		"--kubernetes", kube, "--talos", talos, "--wait", startTimeout(cr.nodes).String()}, cr.flags...)
	out, upErr := exec.CommandContext(ctx, o.sim, args...).CombinedOutput()
	// Stop it whatever happened, keeping its logs first when something failed.
	defer func() {
		if err != nil || cr.keep {
			keepLogs(o.out, dir, cr.logs)
		}
		if out, err := exec.Command(o.sim, "down", "--dir", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: ichor-sim down: %v: %s\n", err, out)
		}
	}()
	if upErr != nil {
		return fmt.Errorf("ichor-sim up: %v: %s", upErr, lastLine(out))
	}

	c := &simCluster{
		dir: dir, kubeconfig: filepath.Join(dir, cluster.KubeconfigFile), talosconfig: filepath.Join(dir, cluster.TalosconfigFile),
		home: filepath.Join(dir, "home"), startSeconds: round(time.Since(start).Seconds()),
	}
	fmt.Fprintf(os.Stderr, "bench: %s: cluster up in %.1fs\n", cr.what, c.startSeconds)

	b, err := os.ReadFile(filepath.Join(dir, cluster.ReadyFile))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, &c.info); err != nil {
		return fmt.Errorf("%s: %w", cluster.ReadyFile, err)
	}

	if err := settle(ctx, c.kubeconfig, cr.nodes); err != nil {
		return err
	}
	if err := os.MkdirAll(c.home, 0o755); err != nil {
		return err
	}
	return f(c)
}

// settle waits until every node is Ready and kube-proxy runs on all of them:
// a cluster that is still starting pods would be measured with it.
func settle(ctx context.Context, kubeconfig string, n int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for {
		ds, err := client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
		if err == nil && int(ds.Status.NumberReady) == n && int(ds.Status.DesiredNumberScheduled) == n {
			return nil
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = fmt.Errorf("kube-proxy ready on %d of %d nodes", ds.Status.NumberReady, n)
			}
			return fmt.Errorf("cluster not settled: %w", err)
		case <-time.After(time.Second):
		}
	}
}

func keepLogs(out, dir, name string) {
	dst := filepath.Join(out, name)
	_ = os.RemoveAll(dst)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return
	}
	for _, p := range []string{cluster.LogDir, cluster.EventsFile} {
		_ = exec.Command("cp", "-r", filepath.Join(dir, p), dst).Run()
	}
	fmt.Fprintf(os.Stderr, "bench: the cluster's logs are kept in %s\n", dst)
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}
