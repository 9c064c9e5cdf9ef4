package main

// upgrade.go is the upgrade benchmark: a cluster of each size with the
// benchmark's latencies and the Job's image run as a local process, a
// workload for the drains to evict, and the upgrade command launched as the
// Job's local-cluster tests launch it and timed from its start to its exit.
// What happened is then read from the records (measure.go).

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
)

const (
	jobImageRepo   = "ghcr.io/ichor-dev/kubectl-ichor"
	upgradeTimeout = 20 * time.Minute
	stateNamespace = "ichor-system"
)

// runUpgrade is the upgrade benchmark of kind k (kind.go).
func runUpgrade(ctx context.Context, o options, k upgradeKind) error {
	if err := checkImageRoot(o); err != nil {
		return err
	}

	o.compare = o.compare && k.peer

	var sizes []int

	sizes, o.sizeMU = k.sizes(o)

	if o.compare {
		if _, err := os.Stat(o.talosctl); err != nil {
			return fmt.Errorf("the peer, talosctl: %w: run make cluster-bins (or pass --compare=false)", err)
		}
	}

	report := UpgradeReport{
		Benchmark: fmt.Sprintf("kubectl-ichor upgrade %s --to %s --yes --max-unavailable %d%s through the Job (cluster at Kubernetes %s, Talos %s)%s",
			k.what, k.to, o.maxUnavailable, ownMU(o, sizes), k.kubernetes, k.talos, compared(o)),
		Formula:        k.formula,
		Started:        time.Now().UTC(),
		Machine:        machine(),
		Latencies:      benchLatencies,
		MaxUnavailable: o.maxUnavailable,
		Targets: UpgradeTargets{
			Wall:            fmt.Sprintf("at most %.2f x the lower bound + %s", targetRatio, targetSlack),
			GapSeconds:      targetGap.Seconds(),
			RequestsPerNode: "not growing with the cluster",
			RunnerRSSMiB:    targetRunnerMiB,
		},
	}

	return suite[UpgradeResult]{
		name:    k.name,
		sizes:   sizes,
		measure: func(ctx context.Context, n int) []UpgradeResult { return upgradeSize(ctx, o, k, n) },
		failure: func(r UpgradeResult) (string, string) {
			what := fmt.Sprintf("%d nodes, --max-unavailable %d", r.Nodes, r.MaxUnavailable)
			if r.Error == "" && r.Talosctl != nil && r.Talosctl.Error != "" {
				return what + ", the peer", r.Talosctl.Error
			}

			return what, r.Error
		},
		report: func(results []UpgradeResult) (any, func(io.Writer)) {
			report.Results, report.Verdict = results, upgradeVerdict(results)
			return report, func(w io.Writer) { writeUpgradeSummary(w, &report) }
		},
	}.run(ctx, o.out)
}

// ownMU names the sizes measured with a --max-unavailable of their own.
func ownMU(o options, sizes []int) string {
	var own []string

	for _, n := range sizes {
		if mu, ok := o.sizeMU[n]; ok {
			own = append(own, fmt.Sprintf("%d at %d nodes", mu, n))
		}
	}

	if len(own) == 0 {
		return ""
	}

	return " (" + strings.Join(own, ", ") + ")"
}

// compared says what ran beside the upgrade measured.
func compared(o options) string {
	if !o.compare {
		return ""
	}

	return "; beside it, each on an identical cluster: --max-unavailable 1 and talosctl upgrade-k8s"
}

// checkImageRoot makes sure the image root runs the plugin measured.
func checkImageRoot(o options) error {
	bin := filepath.Join(o.imageRoot, "usr", "local", "bin", "kubectl-ichor")

	a, err := os.ReadFile(o.plugin)
	if err != nil {
		return err
	}

	b, err := os.ReadFile(bin)
	if err != nil {
		return fmt.Errorf("the Job's image root: %w: run hack/build.sh", err)
	}

	if !bytes.Equal(a, b) {
		return fmt.Errorf("%s is not %s: run hack/build.sh (or pass --image-root)", bin, o.plugin)
	}

	return nil
}

// upgradeSize measures kubectl-ichor's upgrade of n nodes, --max-unavailable
// at a time; with --compare also one worker at a time and the peer,
// talosctl upgrade-k8s, each on a cluster of its own started identically.
// Every result of the size carries the peer's run.
func upgradeSize(ctx context.Context, o options, k upgradeKind, n int) []UpgradeResult {
	mu := o.muFor(n)

	out := []UpgradeResult{upgradeRun(ctx, o, k, n, mu)}
	if !o.compare {
		return out
	}

	if mu != 1 && ctx.Err() == nil {
		out = append(out, upgradeRun(ctx, o, k, n, 1))
	}

	if ctx.Err() != nil {
		return out
	}

	peer := peerSize(ctx, o, n)
	for i := range out {
		out[i].Talosctl = peer
		if peer.Error == "" && out[i].Error == "" && peer.WallSeconds > 0 {
			out[i].RatioToTalosctl = round(out[i].WallSeconds / peer.WallSeconds)
		}
	}

	return out
}

// upgradeClusterFlags are ichor-sim up's flags of every upgrade cluster:
// the Job's image run from the image root, the benchmark's latencies (the pod
// termination through the faults file).
func upgradeClusterFlags(o options) []string {
	flags := append([]string{"--image", jobImageRepo + "=" + o.imageRoot}, benchLatencies.flags()...)
	if o.faults != "" {
		flags = append(flags, "--faults", o.faults)
	}

	return flags
}

// upgradeRun starts a cluster of n nodes, upgrades it maxUnavailable workers
// at a time and stops it.
func upgradeRun(ctx context.Context, o options, k upgradeKind, n, maxUnavailable int) (r UpgradeResult) {
	r = UpgradeResult{Nodes: n, ControlPlanes: controlPlanes, Workers: n - controlPlanes, WorkloadPods: n - controlPlanes, MaxUnavailable: maxUnavailable}
	cr := clusterRun{
		what: fmt.Sprintf("%s %d nodes, --max-unavailable %d", k.name, n, maxUnavailable), nodes: n,
		logs: fmt.Sprintf("%s-logs-%d-nodes-mu%d", k.name, n, maxUnavailable), keep: o.keepLogs,
		kubernetes: k.kubernetes, talos: k.talos, flags: upgradeClusterFlags(o),
	}
	err := withCluster(ctx, o, cr, func(c *simCluster) error {
		r.ClusterStartSeconds = c.startSeconds

		return upgradeOnce(ctx, o, k, c, &r)
	})
	if err != nil {
		r.Error = err.Error()
	}

	return r
}

// upgradeOnce adds the workload to c, upgrades it and measures the upgrade
// into r.
func upgradeOnce(ctx context.Context, o options, k upgradeKind, c *simCluster, r *UpgradeResult) error {
	client, err := newClient(c.kubeconfig)
	if err != nil {
		return err
	}

	if err := addWorkload(ctx, client, int32(r.WorkloadPods)); err != nil {
		return err
	}

	r.LoadAvgBefore = loadAvg()

	// Exactly as the Job's local-cluster tests launch it.
	upCtx, cancel := context.WithTimeout(ctx, upgradeTimeout)
	defer cancel()

	cmd := exec.CommandContext(upCtx, o.plugin, "upgrade", k.what, "--to", k.to, "--yes",
		"--max-unavailable", strconv.Itoa(r.MaxUnavailable), "--kubeconfig", c.kubeconfig, "--talosconfig", c.talosconfig)
	cmd.Env = append(cleanEnviron(), "HOME="+c.home)
	// Its own process group: a signal for the benchmark's group does not detach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	var output bytes.Buffer

	cmd.Stdout, cmd.Stderr = &output, &output

	// A script following the operation, for the estimates of the time left.
	var est estimateWatch

	watchCtx, stopWatch := context.WithCancel(upCtx)
	watched := make(chan struct{})

	go func() {
		defer close(watched)
		est.run(watchCtx, o.plugin, cmd.Env, c.kubeconfig)
	}()

	began := time.Now()
	err = cmd.Run()
	ended := time.Now()
	r.WallSeconds = round(ended.Sub(began).Seconds())
	r.LoadAvgAfter = loadAvg()

	stopWatch()
	<-watched

	r.Estimates = est.samples(began, ended)

	_ = os.WriteFile(filepath.Join(c.dir, cluster.LogDir, "upgrade.out"), output.Bytes(), 0o644)

	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (the benchmark was interrupted)", err)
		}

		return fmt.Errorf("kubectl-ichor upgrade %s: %v: %s", k.what, err, lastLine(output.Bytes()))
	}

	fmt.Fprintf(os.Stderr, "bench: %s %d nodes, --max-unavailable %d: upgraded in %.1fs\n", k.name, r.Nodes, r.MaxUnavailable, r.WallSeconds)

	t, err := measureUpgrade(ctx, k, c.dir, client, began, ended, r)
	if err != nil {
		return err
	}

	t.Title = fmt.Sprintf("kubectl-ichor upgrade %s --to %s --max-unavailable %d, %d+%d nodes", k.what, k.to, r.MaxUnavailable, r.ControlPlanes, r.Workers)
	t.Subtitle = fmt.Sprintf("wall %.1fs, bound %.1fs (%.2f x); %s -> %s (Kubernetes %s, Talos %s at the start); load average %s at the start, %s at the end",
		r.WallSeconds, r.LowerBound.Seconds, r.Ratio, k.from, k.to, k.kubernetes, k.talos, r.LoadAvgBefore, r.LoadAvgAfter)

	name := fmt.Sprintf("%s%d-nodes-mu%d.svg", k.timelines, r.Nodes, r.MaxUnavailable)
	if err := os.WriteFile(filepath.Join(o.out, name), svgTimeline(t), 0o644); err != nil {
		return err
	}

	r.Timeline = name

	return nil
}

// cleanEnviron is the environment without what would point the plugin at
// another cluster.
func cleanEnviron() []string {
	var out []string

	for _, kv := range os.Environ() {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "KUBECONFIG", "TALOSCONFIG", "TALOS_HOME", "HOME":
		default:
			out = append(out, kv)
		}
	}

	return out
}

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}

	cfg.QPS, cfg.Burst = 50, 100

	return kubernetes.NewForConfig(cfg)
}

// addWorkload runs a Deployment of replicas simulated pods (no disruption
// budget) on the workers, for the drains to evict.
func addWorkload(ctx context.Context, client kubernetes.Interface, replicas int32) error {
	labels := map[string]string{"app": "bench"}

	_, err := client.AppsV1().Deployments("default").Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "bench"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("workload: %w", err)
	}

	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	for {
		d, err := client.AppsV1().Deployments("default").Get(ctx, "bench", metav1.GetOptions{})
		if err == nil && d.Status.ReadyReplicas == replicas {
			return nil
		}

		select {
		case <-ctx.Done():
			return fmt.Errorf("workload: %d pods not Ready: %w", replicas, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}
