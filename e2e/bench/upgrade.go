package main

// The upgrade benchmark starts a cluster of each size with fixed simulated
// latencies and the Job's image run as a local process, adds a workload for
// the drains to evict, and runs
//
//	kubectl-ichor upgrade kubernetes --to v1.36.3 --yes --max-unavailable 5
//
// as the Job's local-cluster tests launch it. It then reads what happened
// from four records, none of them the plugin's own output:
//
//   - the simulator's events.jsonl: when each component started at a version
//     on each node (when the cluster made a node's verification true);
//   - the state ConfigMap: each node's timeline (when its apply began and
//     when it was done, per stage, to the microsecond) and the plan;
//   - each runner pod's log: its request stats lines (Kubernetes requests
//     and Talos calls, counted in the runner);
//   - each runner pod's <ns>_<pod>_<container>.usage.json, written by the
//     simulated kubelet when the process ends: peak RSS and CPU seconds.
//
// It writes OUT/upgrade.json and the summary OUT/upgrade.txt (also printed).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/cluster"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// The simulator's latencies for the upgrade benchmark, fixed here (not taken
// from ichor-sim's defaults) so that figures of different days compare.
var benchLatencies = Latencies{
	StaticPodRestart: 2 * time.Second,
	Ready:            time.Second,
	KubeletRestart:   2 * time.Second,
	PodStart:         300 * time.Millisecond,
	ImagePull:        200 * time.Millisecond,
	Reboot:           3 * time.Second,
}

const (
	// jobFailureBackoff is the Job controller's delay before it replaces a
	// failed pod (kube-controller-manager's DefaultJobPodFailureBackOff,
	// not configurable): it counts failures its podFailurePolicy ignores
	// too, so the runner evicted by its own node's drain is replaced after it.
	jobFailureBackoff = 10 * time.Second
	// podTermination is how long an evicted pod takes to go: the simulator
	// stops a simulated pod at once (it has no flag for it).
	podTermination = 0

	targetRatio      = 1.10
	targetSlack      = 5 * time.Second
	targetGap        = time.Second
	targetRunnerMiB  = 128
	targetPerNodeTol = 1.10 // per-node requests at the larger size at most this times the smaller's

	jobImageRepo   = "ghcr.io/ichor-dev/kubectl-ichor"
	upgradeTimeout = 20 * time.Minute
	stateNamespace = "ichor-system"
)

// Latencies are the simulator's latencies (ichor-sim up flags).
type Latencies struct {
	StaticPodRestart time.Duration
	Ready            time.Duration
	KubeletRestart   time.Duration
	PodStart         time.Duration
	ImagePull        time.Duration
	Reboot           time.Duration
}

func (l Latencies) flags() []string {
	return []string{
		"--static-pod-restart", l.StaticPodRestart.String(), "--ready-latency", l.Ready.String(),
		"--kubelet-restart", l.KubeletRestart.String(), "--pod-start", l.PodStart.String(),
		"--image-pull", l.ImagePull.String(), "--reboot", l.Reboot.String(),
	}
}

// MarshalJSON writes the latencies in seconds.
func (l Latencies) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]float64{
		"staticPodRestartSeconds": l.StaticPodRestart.Seconds(), "readySeconds": l.Ready.Seconds(),
		"kubeletRestartSeconds": l.KubeletRestart.Seconds(), "podStartSeconds": l.PodStart.Seconds(),
		"imagePullSeconds": l.ImagePull.Seconds(), "rebootSeconds": l.Reboot.Seconds(),
		"podTerminationSeconds": podTermination, "jobFailureBackoffSeconds": jobFailureBackoff.Seconds(),
	})
}

// UpgradeReport is upgrade.json.
type UpgradeReport struct {
	Benchmark      string          `json:"benchmark"`
	Started        time.Time       `json:"started"`
	Machine        Machine         `json:"machine"`
	Latencies      Latencies       `json:"latencies"`
	MaxUnavailable int             `json:"maxUnavailable"`
	Targets        UpgradeTargets  `json:"targets"`
	Results        []UpgradeResult `json:"results"`
	Verdict        []string        `json:"verdict"`
}

// UpgradeTargets are what the figures are held against.
type UpgradeTargets struct {
	Wall            string  `json:"wall"`
	GapSeconds      float64 `json:"gapSeconds"`
	RequestsPerNode string  `json:"requestsPerNode"`
	RunnerRSSMiB    float64 `json:"runnerRSSMiB"`
}

// UpgradeResult is one cluster size.
type UpgradeResult struct {
	Nodes               int     `json:"nodes"`
	ControlPlanes       int     `json:"controlPlanes"`
	Workers             int     `json:"workers"`
	WorkloadPods        int     `json:"workloadPods"`
	ClusterStartSeconds float64 `json:"clusterStartSeconds,omitempty"`
	LoadAvgBefore       string  `json:"loadAverageBefore,omitempty"`

	// WallSeconds is the upgrade command's, from its start to its exit.
	WallSeconds float64 `json:"wallSeconds"`
	// Split of the wall time: until the first apply began (plan, launch,
	// the Job's pod, the lock, the first stage's reads and pre-pull), the
	// first apply to the last node done, and the rest (the command sees the
	// end).
	LaunchSeconds float64 `json:"launchSeconds"`
	RunSeconds    float64 `json:"runSeconds"`
	TailSeconds   float64 `json:"tailSeconds"`

	LowerBound Bound   `json:"lowerBound"`
	Ratio      float64 `json:"ratio"`
	// Stages are each stage's time, from the previous one's end (the first
	// from the command's start) to its last node verified (KubeProxy: its
	// rollout done), beside its share of the bound.
	Stages []StageTime `json:"stages"`

	Gaps GapReport `json:"gaps"`

	// Estimates are status --watch -o json's estimates of the time left at a
	// quarter, half and three quarters of the upgrade, against the truth.
	Estimates []EstimateSample `json:"estimates,omitempty"`

	RunnerPods          []RunnerPod    `json:"runnerPods"`
	RunnerPeakRSSMiB    float64        `json:"runnerPeakRSSMiB"`
	RunnerCPUSeconds    float64        `json:"runnerCPUSeconds"`
	KubernetesRequests  int            `json:"kubernetesRequests"`
	KubernetesPerNode   float64        `json:"kubernetesRequestsPerNode"`
	KubernetesByRequest map[string]int `json:"kubernetesRequestsByRequest,omitempty"`
	TalosCalls          int            `json:"talosCalls"`
	TalosPerNode        float64        `json:"talosCallsPerNode"`
	TalosByMethod       map[string]int `json:"talosCallsByMethod,omitempty"`

	Error string `json:"error,omitempty"`
}

// Bound is the critical-path lower bound and how it was computed.
type Bound struct {
	Seconds float64     `json:"seconds"`
	Terms   []BoundTerm `json:"terms"`
}

// BoundTerm is one serial step of the critical path, Count times Each.
type BoundTerm struct {
	Stage   string  `json:"stage"`
	What    string  `json:"what"`
	Count   int     `json:"count"`
	Each    float64 `json:"eachSeconds"`
	Seconds float64 `json:"seconds"`
}

// StageTime is one stage's time against its share of the bound.
type StageTime struct {
	Stage        string  `json:"stage"`
	Seconds      float64 `json:"seconds"`
	BoundSeconds float64 `json:"boundSeconds"`
}

// GapReport are the waits between a node (or a batch) being verified and the
// next apply starting.
type GapReport struct {
	// LongestSeconds and MedianSeconds are over Gaps, without the one the
	// runner's replacement spans.
	LongestSeconds float64 `json:"longestSeconds"`
	MedianSeconds  float64 `json:"medianSeconds"`
	Gaps           []Gap   `json:"gaps"`
	// Missing names the groups whose times could not be read.
	Missing []string `json:"missing,omitempty"`
}

// Gap is one wait.
type Gap struct {
	Stage string `json:"stage"`
	// From is the group verified, To the group whose apply started next.
	From    string  `json:"from"`
	To      string  `json:"to"`
	Seconds float64 `json:"seconds"`
	// Required is what was subtracted as work the design requires in
	// between (a stage's pre-pull, the kube-proxy rollout), in seconds.
	Required float64 `json:"requiredSeconds,omitempty"`
	// RunnerReplaced is true when a new runner pod took over in the gap.
	RunnerReplaced bool `json:"runnerReplaced,omitempty"`
}

// RunnerPod is what one runner pod used, from its usage.json.
type RunnerPod struct {
	Name        string  `json:"name"`
	Node        string  `json:"node"`
	ExitCode    int     `json:"exitCode"`
	MaxRSSMiB   float64 `json:"maxRSSMiB"`
	CPUSeconds  float64 `json:"cpuSeconds"`
	WallSeconds float64 `json:"wallSeconds"`
	// KubernetesRequests and TalosCalls are from its log's request stats.
	KubernetesRequests int `json:"kubernetesRequests"`
	TalosCalls         int `json:"talosCalls"`
}

// lowerBound is the critical path of a Kubernetes upgrade of cps control
// planes and workers, maxUnavailable at a time, from the simulator's
// latencies: every wait the design makes serial, nothing the tool adds.
//
//	bound = PS                                  the first runner pod starts
//	      + 4 x IP                              each stage's pre-pull, every node at once
//	      + cps x (SPR + RL)                    APIServers: one control plane at a time, its apiserver restarts and gets Ready
//	      + cps x (SPR + RL)                    ControlPlaneComponents: controller-manager and scheduler restart together
//	      + N x (T + PS + RL)                   KubeProxy: the DaemonSet rolls one pod at a time (maxUnavailable 1);
//	                                            the control planes' applies restart no static pod and overlap it
//	      + (cps + ceil(W / mu)) x (T + KR)     Kubelets: control planes one at a time, then workers mu at a time:
//	                                            drain (pod termination), kubelet restart
//	      + JB + PS                             Kubelets: the drain of the runner's own node evicts it; the Job
//	                                            controller replaces the pod after its failure backoff
//
// with SPR the static pod restart, RL the ready latency, KR the kubelet
// restart, PS the pod start, IP the image pull, T the pod termination (0 in
// the simulator), JB the Job controller's failure backoff (10 s), N the nodes
// and W the workers.
func lowerBound(l Latencies, cps, workers, maxUnavailable int) Bound {
	n := cps + workers
	spr, rl, kr, ps, ip := l.StaticPodRestart.Seconds(), l.Ready.Seconds(), l.KubeletRestart.Seconds(), l.PodStart.Seconds(), l.ImagePull.Seconds()
	t := float64(podTermination)
	batches := (workers + maxUnavailable - 1) / maxUnavailable

	terms := []BoundTerm{
		{Stage: "APIServers", What: "the first runner pod starts (PS)", Count: 1, Each: ps},
		{Stage: "APIServers", What: "pre-pull (IP)", Count: 1, Each: ip},
		{Stage: "APIServers", What: "a control plane's apiserver restarts and gets Ready (SPR + RL)", Count: cps, Each: spr + rl},
		{Stage: "ControlPlaneComponents", What: "pre-pull (IP)", Count: 1, Each: ip},
		{Stage: "ControlPlaneComponents", What: "its controller-manager and scheduler restart and get Ready (SPR + RL)", Count: cps, Each: spr + rl},
		{Stage: "KubeProxy", What: "pre-pull (IP)", Count: 1, Each: ip},
		{Stage: "KubeProxy", What: "the DaemonSet replaces one pod at a time (T + PS + RL)", Count: n, Each: t + ps + rl},
		{Stage: "Kubelets", What: "pre-pull (IP)", Count: 1, Each: ip},
		{Stage: "Kubelets", What: fmt.Sprintf("a control plane, then %d workers at a time: drain, kubelet restart (T + KR)", maxUnavailable), Count: cps + batches, Each: t + kr},
		{Stage: "Kubelets", What: "the runner, evicted by its node's drain, replaced after the Job's failure backoff (JB + PS)", Count: 1, Each: jobFailureBackoff.Seconds() + ps},
	}

	var b Bound

	for i := range terms {
		terms[i].Each = round(terms[i].Each)
		terms[i].Seconds = round(float64(terms[i].Count) * terms[i].Each)
		b.Seconds += terms[i].Seconds
	}

	b.Seconds, b.Terms = round(b.Seconds), terms

	return b
}

// boundFormula is lowerBound's formula, for the summary.
const boundFormula = `bound = PS + 4 x IP + cps x (SPR + RL) + cps x (SPR + RL) + N x (T + PS + RL)
        + (cps + ceil(W / mu)) x (T + KR) + (JB + PS)`

func runUpgrade(ctx context.Context, o options) error {
	if err := checkImageRoot(o); err != nil {
		return err
	}

	report := UpgradeReport{
		Benchmark: fmt.Sprintf("kubectl-ichor upgrade kubernetes --to %s --yes --max-unavailable %d through the Job (cluster at %s, Talos %s)",
			toVersion, o.maxUnavailable, fromVersion, talosVersion),
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

	var failed []string

	for _, n := range o.upgradeSizes {
		r := upgradeSize(ctx, o, n)
		if r.Error != "" {
			failed = append(failed, fmt.Sprintf("%d nodes: %s", n, r.Error))
			fmt.Fprintf(os.Stderr, "bench: upgrade %d nodes: %s\n", n, r.Error)
		}

		report.Results = append(report.Results, r)

		if ctx.Err() != nil {
			break
		}
	}

	report.Verdict = upgradeVerdict(report.Results)

	b, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}

	if err := os.WriteFile(filepath.Join(o.out, "upgrade.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}

	var summary bytes.Buffer

	writeUpgradeSummary(&summary, &report)

	if err := os.WriteFile(filepath.Join(o.out, "upgrade.txt"), summary.Bytes(), 0o644); err != nil {
		return err
	}

	fmt.Print(summary.String())
	fmt.Printf("\nwritten: %s, %s\n", filepath.Join(o.out, "upgrade.json"), filepath.Join(o.out, "upgrade.txt"))

	if len(failed) > 0 {
		return fmt.Errorf("upgrade not measured: %s", strings.Join(failed, "; "))
	}

	return nil
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

// upgradeSize starts a cluster of n nodes, upgrades it and stops it.
func upgradeSize(ctx context.Context, o options, n int) (r UpgradeResult) {
	r = UpgradeResult{Nodes: n, ControlPlanes: controlPlanes, Workers: n - controlPlanes, WorkloadPods: n - controlPlanes}
	fmt.Fprintf(os.Stderr, "bench: upgrade %d nodes: starting a cluster of %d control planes and %d workers\n", n, r.ControlPlanes, r.Workers)

	dir, err := os.MkdirTemp("", "ichor-bench-")
	if err != nil {
		r.Error = err.Error()

		return r
	}
	defer os.RemoveAll(dir)

	start := time.Now()
	args := append([]string{"up", "--dir", dir, "--bin-dir", o.binDir,
		"--control-planes", strconv.Itoa(r.ControlPlanes), "--workers", strconv.Itoa(r.Workers),
		"--kubernetes", fromVersion, "--talos", talosVersion, "--wait", clusterStartMax.String(),
		"--image", jobImageRepo + "=" + o.imageRoot}, benchLatencies.flags()...)
	out, upErr := exec.CommandContext(ctx, o.sim, args...).CombinedOutput()

	defer func() {
		if r.Error != "" || o.keepLogs {
			keepLogs(o.out, dir, fmt.Sprintf("upgrade-logs-%d-nodes", n))
		}

		if out, err := exec.Command(o.sim, "down", "--dir", dir).CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "bench: ichor-sim down: %v: %s\n", err, out)
		}
	}()

	if upErr != nil {
		r.Error = fmt.Sprintf("ichor-sim up: %v: %s", upErr, lastLine(out))

		return r
	}

	r.ClusterStartSeconds = round(time.Since(start).Seconds())
	fmt.Fprintf(os.Stderr, "bench: upgrade %d nodes: cluster up in %.1fs\n", n, r.ClusterStartSeconds)

	kubeconfig, talosconfig := filepath.Join(dir, cluster.KubeconfigFile), filepath.Join(dir, cluster.TalosconfigFile)

	client, err := newClient(kubeconfig)
	if err != nil {
		r.Error = err.Error()

		return r
	}

	if err := settle(ctx, kubeconfig, n); err != nil {
		r.Error = err.Error()

		return r
	}

	if err := addWorkload(ctx, client, int32(r.WorkloadPods)); err != nil {
		r.Error = err.Error()

		return r
	}

	r.LoadAvgBefore = loadAvg()

	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		r.Error = err.Error()

		return r
	}

	// Exactly as the Job's local-cluster tests launch it.
	upCtx, cancel := context.WithTimeout(ctx, upgradeTimeout)
	defer cancel()

	cmd := exec.CommandContext(upCtx, o.plugin, "upgrade", "kubernetes", "--to", toVersion, "--yes",
		"--max-unavailable", strconv.Itoa(o.maxUnavailable), "--kubeconfig", kubeconfig, "--talosconfig", talosconfig)
	cmd.Env = append(cleanEnviron(), "HOME="+home)
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
		est.run(watchCtx, o.plugin, cmd.Env, kubeconfig)
	}()

	began := time.Now()
	err = cmd.Run()
	ended := time.Now()
	r.WallSeconds = round(ended.Sub(began).Seconds())

	stopWatch()
	<-watched

	r.Estimates = est.samples(began, ended)

	_ = os.WriteFile(filepath.Join(dir, cluster.LogDir, "upgrade.out"), output.Bytes(), 0o644)

	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (the benchmark was interrupted)", err)
		}

		r.Error = fmt.Sprintf("kubectl-ichor upgrade: %v: %s", err, lastLine(output.Bytes()))

		return r
	}

	fmt.Fprintf(os.Stderr, "bench: upgrade %d nodes: upgraded in %.1fs\n", n, r.WallSeconds)

	if err := measureUpgrade(ctx, o, dir, client, began, ended, &r); err != nil {
		r.Error = err.Error()
	}

	return r
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

// measureUpgrade reads the records of a finished upgrade into r.
func measureUpgrade(ctx context.Context, o options, dir string, client kubernetes.Interface, began, ended time.Time, r *UpgradeResult) error {
	cm, err := client.CoreV1().ConfigMaps(stateNamespace).Get(ctx, job.StateName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}

	op, err := job.DecodeState(cm)
	if err != nil {
		return err
	}

	if op.Status.Phase != job.PhaseSucceeded {
		return fmt.Errorf("operation %s is %s: %s", op.Spec.ID, op.Status.Phase, op.Status.Reason)
	}

	raw, err := job.StatePlan(cm)
	if err != nil {
		return err
	}

	var plan api.Plan
	if err := json.Unmarshal(raw, &plan); err != nil {
		return fmt.Errorf("the state's plan: %w", err)
	}

	evs, err := events.Read(filepath.Join(dir, cluster.EventsFile))
	if err != nil {
		return err
	}

	pods, err := runnerPods(ctx, filepath.Join(dir, cluster.LogDir, "pods"), op.Spec.CreatedAt.Time)
	if err != nil {
		return err
	}

	self := ""
	if len(pods) > 0 {
		self = pods[0].Node
	}

	r.KubernetesByRequest, r.TalosByMethod = map[string]int{}, map[string]int{}

	for _, p := range pods {
		r.RunnerPods = append(r.RunnerPods, p.RunnerPod)
		r.RunnerPeakRSSMiB = max(r.RunnerPeakRSSMiB, p.MaxRSSMiB)
		r.RunnerCPUSeconds = round(r.RunnerCPUSeconds + p.CPUSeconds)
		r.KubernetesRequests += p.stats.kube
		r.TalosCalls += p.stats.talos

		for k, v := range p.stats.kubeBy {
			r.KubernetesByRequest[k] += v
		}

		for k, v := range p.stats.talosBy {
			r.TalosByMethod[k] += v
		}
	}

	r.KubernetesPerNode = round(float64(r.KubernetesRequests) / float64(r.Nodes))
	r.TalosPerNode = round(float64(r.TalosCalls) / float64(r.Nodes))

	r.LowerBound = lowerBound(benchLatencies, r.ControlPlanes, r.Workers, o.maxUnavailable)
	r.Ratio = round(r.WallSeconds / r.LowerBound.Seconds)

	tl := timelines(op)
	first, last := tl.span()

	if !first.IsZero() {
		r.LaunchSeconds = round(first.Sub(began).Seconds())
		r.RunSeconds = round(last.Sub(first).Seconds())
		r.TailSeconds = round(ended.Sub(last).Seconds())
	}

	var takeovers []time.Time
	for _, p := range pods[min(1, len(pods)):] {
		takeovers = append(takeovers, p.locked)
	}

	var ends map[string]time.Time

	r.Gaps, ends = gaps(&plan, tl, evs, self, o.maxUnavailable, takeovers)

	prev := began

	for _, s := range plan.Stages {
		st := StageTime{Stage: s.Name}

		for _, t := range r.LowerBound.Terms {
			if t.Stage == s.Name {
				st.BoundSeconds = round(st.BoundSeconds + t.Seconds)
			}
		}

		if end, ok := ends[s.Name]; ok && !prev.IsZero() {
			st.Seconds = round(end.Sub(prev).Seconds())
			prev = end
		} else {
			prev = time.Time{}
		}

		r.Stages = append(r.Stages, st)
	}

	return nil
}

// runnerPod is a runner pod's record.
type runnerPod struct {
	RunnerPod

	stats  requestCounts
	locked time.Time // when it took the lock (to the second)
}

var (
	runnerNodeRE   = regexp.MustCompile(`^(\d\d:\d\d:\d\d) operation \S+: .* runner (\S+) on node (\S+) waiting for the lock`)
	runnerLockRE   = regexp.MustCompile(`^(\d\d:\d\d:\d\d) took the lock: `)
	runnerStatsPfx = regexp.MustCompile(`^\d\d:\d\d:\d\d `)
)

// runnerPods reads every runner pod's log and usage, in the order they took
// the lock, waiting a little for the last one's usage (written when its
// process ends, which may be after the command saw the operation succeed).
func runnerPods(ctx context.Context, logDir string, day time.Time) ([]runnerPod, error) {
	logs, err := filepath.Glob(filepath.Join(logDir, stateNamespace+"_*_runner.log"))
	if err != nil || len(logs) == 0 {
		return nil, fmt.Errorf("no runner pod log in %s", logDir)
	}

	var out []runnerPod

	for _, path := range logs {
		p, err := readRunnerPod(ctx, path, day)
		if err != nil {
			return nil, err
		}

		out = append(out, p)
	}

	sort.Slice(out, func(i, j int) bool { return out[i].locked.Before(out[j].locked) })

	return out, nil
}

func readRunnerPod(ctx context.Context, path string, day time.Time) (runnerPod, error) {
	usagePath := strings.TrimSuffix(path, ".log") + ".usage.json"

	var usage struct {
		Pod         string  `json:"pod"`
		ExitCode    int     `json:"exitCode"`
		MaxRSSBytes int64   `json:"maxRSSBytes"`
		UserSeconds float64 `json:"userSeconds"`
		SysSeconds  float64 `json:"sysSeconds"`
		WallSeconds float64 `json:"wallSeconds"`
	}

	deadline := time.Now().Add(time.Minute)

	for {
		b, err := os.ReadFile(usagePath)
		if err == nil {
			if err := json.Unmarshal(b, &usage); err != nil {
				return runnerPod{}, fmt.Errorf("%s: %w", usagePath, err)
			}

			break
		}

		if time.Now().After(deadline) {
			return runnerPod{}, fmt.Errorf("no usage of the runner pod after a minute: %w", err)
		}

		select {
		case <-ctx.Done():
			return runnerPod{}, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}

	p := runnerPod{RunnerPod: RunnerPod{
		Name: strings.TrimPrefix(usage.Pod, stateNamespace+"/"), ExitCode: usage.ExitCode,
		MaxRSSMiB:   round(float64(usage.MaxRSSBytes) / (1 << 20)),
		CPUSeconds:  round(usage.UserSeconds + usage.SysSeconds),
		WallSeconds: round(usage.WallSeconds),
	}}

	f, err := os.Open(path)
	if err != nil {
		return p, err
	}
	defer f.Close()

	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)

	for sc.Scan() {
		line := sc.Text()

		if m := runnerNodeRE.FindStringSubmatch(line); m != nil {
			p.Node = m[3]
		}

		if m := runnerLockRE.FindStringSubmatch(line); m != nil {
			p.locked = clockOn(day, m[1])
		}

		line = runnerStatsPfx.ReplaceAllString(line, "")
		if m := kubeStatsRE.FindStringSubmatch(line); m != nil {
			p.stats.kube, _ = strconv.Atoi(m[1])
			p.stats.kubeBy = parseBreakdown(m[2])
		}

		if m := talosStatsRE.FindStringSubmatch(line); m != nil {
			p.stats.talos, _ = strconv.Atoi(m[1])
			p.stats.talosNodes, _ = strconv.Atoi(m[2])
			p.stats.talosBy = parseBreakdown(m[3])
		}
	}

	if p.stats.kubeBy == nil {
		return p, fmt.Errorf("%s: no request stats lines (is the runner older than its request stats?)", path)
	}

	p.KubernetesRequests, p.TalosCalls = p.stats.kube, p.stats.talos

	return p, sc.Err()
}

// clockOn is the time of day hh:mm:ss (UTC) on the day of t, or the next day
// when that is more than an hour before t.
func clockOn(t time.Time, hms string) time.Time {
	c, err := time.Parse("15:04:05", hms)
	if err != nil {
		return time.Time{}
	}

	t = t.UTC()
	at := time.Date(t.Year(), t.Month(), t.Day(), c.Hour(), c.Minute(), c.Second(), 0, time.UTC)

	if at.Before(t.Add(-time.Hour)) {
		at = at.Add(24 * time.Hour)
	}

	return at
}

// nodeTimes are a node's times in one stage.
type nodeTimes struct {
	applyStarted, done time.Time
}

// stageTimelines are the state's timelines by stage and node.
type stageTimelines map[string]map[string]nodeTimes

func timelines(op *job.Operation) stageTimelines {
	out := stageTimelines{}

	for _, n := range op.Status.Nodes {
		for _, t := range n.Timeline {
			if out[t.Stage] == nil {
				out[t.Stage] = map[string]nodeTimes{}
			}

			var nt nodeTimes
			if t.ApplyStarted != nil {
				nt.applyStarted = t.ApplyStarted.Time
			}

			if t.Done != nil {
				nt.done = t.Done.Time
			}

			out[t.Stage][n.Name] = nt
		}
	}

	return out
}

// span is the first apply's start and the last node's end.
func (tl stageTimelines) span() (first, last time.Time) {
	for _, nodes := range tl {
		for _, t := range nodes {
			if !t.applyStarted.IsZero() && (first.IsZero() || t.applyStarted.Before(first)) {
				first = t.applyStarted
			}

			if t.done.After(last) {
				last = t.done
			}
		}
	}

	return first, last
}

// group is nodes that move together in a stage.
type group []api.NodeStep

func (g group) String() string {
	names := make([]string, 0, len(g))
	for _, n := range g {
		names = append(names, n.Node)
	}

	if len(names) == 1 {
		return names[0]
	}

	return "[" + strings.Join(names, " ") + "]"
}

// groups lays out a stage's nodes as the engine visits them: control planes
// one at a time, then workers maxUnavailable at a time, the runner's node
// last in its group (the plan was made before a runner had a node).
func groups(s api.Stage, self string, maxUnavailable int) []group {
	var cps, workers []api.NodeStep

	for _, n := range s.Nodes {
		if n.Role == api.RoleControlPlane {
			cps = append(cps, n)
		} else {
			workers = append(workers, n)
		}
	}

	last := func(list []api.NodeStep) []api.NodeStep {
		i := slices.IndexFunc(list, func(n api.NodeStep) bool { return n.Node == self })
		if i < 0 {
			return list
		}

		n := list[i]

		return append(slices.Delete(slices.Clone(list), i, i+1), n)
	}

	var out []group

	for _, n := range last(cps) {
		out = append(out, group{n})
	}

	workers = last(workers)
	for i := 0; i < len(workers); i += maxUnavailable {
		out = append(out, group(workers[i:min(i+maxUnavailable, len(workers))]))
	}

	return out
}

// staticPods are the components whose verification waits for a mirror pod's
// readiness after the start the events log records.
var staticPods = map[string]bool{events.APIServer: true, events.ControllerManager: true, events.Scheduler: true}

// verifiedAt is when the cluster made a node's verification in a stage true:
// the last start, at the target, of a component the stage changes on the
// node (plus the readiness latency of a static pod), from events.jsonl; for a
// node where no component restarts (KubeProxy on a control plane: kube-proxy
// moves with the DaemonSet), when the runner saw it done.
func verifiedAt(n api.NodeStep, evs []events.Event, t nodeTimes) time.Time {
	var at time.Time

	for _, ch := range n.Changes {
		if ch.Component == events.KubeProxy {
			continue
		}

		for _, e := range evs {
			if e.Node != n.Node || e.Component != ch.Component || e.Version != tagOf(ch.To) {
				continue
			}

			ready := e.Time
			if staticPods[e.Component] {
				ready = ready.Add(benchLatencies.Ready)
			}

			at = later(at, ready)

			break
		}
	}

	if at.IsZero() {
		return t.done
	}

	return at
}

// gaps are the waits between a group being verified and the next group's
// apply starting, within each stage, and at each stage's start (less its
// pre-pull, and for Kubelets the kube-proxy rollout before it). It also
// returns when each stage ended: its last group verified (KubeProxy: its
// rollout done).
func gaps(plan *api.Plan, tl stageTimelines, evs []events.Event, self string, maxUnavailable int, takeovers []time.Time) (GapReport, map[string]time.Time) {
	var (
		ends    = map[string]time.Time{}
		rep     GapReport
		prevEnd time.Time // when the previous stage's last group was verified (or its rollout done)
		prevWho string
	)

	for _, s := range plan.Stages {
		if s.Skipped {
			continue
		}

		times := tl[s.Name]

		var prevVerified time.Time

		prev := ""

		for i, g := range groups(s, self, maxUnavailable) {
			var started, verified time.Time

			complete := true

			for _, n := range g {
				t, ok := times[n.Node]
				if !ok || t.done.IsZero() {
					complete = false

					continue
				}

				if !t.applyStarted.IsZero() && (started.IsZero() || t.applyStarted.Before(started)) {
					started = t.applyStarted
				}

				verified = later(verified, verifiedAt(n, evs, t))
			}

			if !complete || started.IsZero() {
				rep.Missing = append(rep.Missing, fmt.Sprintf("%s %s", s.Name, g))
				prevVerified, prev = time.Time{}, ""

				continue
			}

			switch {
			case i > 0 && !prevVerified.IsZero():
				rep.Gaps = append(rep.Gaps, newGap(s.Name, prev, g.String(), prevVerified, started, 0, takeovers))
			case i == 0 && !prevEnd.IsZero():
				rep.Gaps = append(rep.Gaps, newGap(s.Name, prevWho, g.String(), prevEnd, started, benchLatencies.ImagePull, takeovers))
			}

			prevVerified, prev = verified, g.String()
		}

		prevEnd, prevWho = prevVerified, s.Name+" "+prev

		if s.Name == "KubeProxy" && !prevEnd.IsZero() {
			prevEnd, prevWho = later(prevEnd, rolloutDone(evs)), "KubeProxy rollout"
		}

		if !prevEnd.IsZero() {
			ends[s.Name] = prevEnd
		}
	}

	var counted []float64

	for _, g := range rep.Gaps {
		if !g.RunnerReplaced {
			counted = append(counted, g.Seconds)
		}
	}

	if len(counted) > 0 {
		rep.LongestSeconds = slices.Max(counted)
		rep.MedianSeconds = spread(counted).Median
	}

	return rep, ends
}

func newGap(stage, from, to string, verified, started time.Time, required time.Duration, takeovers []time.Time) Gap {
	g := Gap{Stage: stage, From: from, To: to, Required: required.Seconds()}
	g.Seconds = round(started.Sub(verified).Seconds() - g.Required)

	for _, t := range takeovers {
		// The lock's time is to the second.
		if !t.Before(verified.Truncate(time.Second)) && !t.After(started) {
			g.RunnerReplaced = true
		}
	}

	return g
}

// rolloutDone is when the last kube-proxy pod at the target got Ready.
func rolloutDone(evs []events.Event) time.Time {
	var at time.Time

	for _, e := range evs {
		if e.Component == events.KubeProxy && e.Version == toVersion {
			at = later(at, e.Time.Add(benchLatencies.Ready))
		}
	}

	return at
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}

	return a
}

func tagOf(image string) string {
	if i := strings.LastIndex(image, ":"); i >= 0 && !strings.Contains(image[i:], "/") {
		return image[i+1:]
	}

	return image
}

// upgradeVerdict holds the figures against the targets.
func upgradeVerdict(results []UpgradeResult) []string {
	var (
		ok  []UpgradeResult
		out []string
	)

	for _, r := range results {
		if r.Error == "" {
			ok = append(ok, r)
		}
	}

	if len(ok) == 0 {
		return []string{"nothing measured"}
	}

	met := func(b bool) string {
		if b {
			return "met"
		}

		return "NOT met"
	}

	for _, r := range ok {
		limit := targetRatio*r.LowerBound.Seconds + targetSlack.Seconds()
		out = append(out,
			fmt.Sprintf("%d nodes: wall time at most %.2f x bound + %s = %.1fs: %s (%.1fs, %.2f x the bound of %.1fs)",
				r.Nodes, targetRatio, targetSlack, limit, met(r.WallSeconds <= limit), r.WallSeconds, r.Ratio, r.LowerBound.Seconds),
			fmt.Sprintf("%d nodes: no gap over %s: %s (longest %.2fs, median %.2fs, over %d gaps)",
				r.Nodes, targetGap, met(r.Gaps.LongestSeconds <= targetGap.Seconds()), r.Gaps.LongestSeconds, r.Gaps.MedianSeconds, len(r.Gaps.Gaps)),
			estimateVerdict(r),
			fmt.Sprintf("%d nodes: runner under %d MiB: %s (peak %.1f MiB over %d pod(s))",
				r.Nodes, targetRunnerMiB, met(r.RunnerPeakRSSMiB < targetRunnerMiB), r.RunnerPeakRSSMiB, len(r.RunnerPods)))
	}

	if len(ok) < 2 {
		return append(out, "requests per node not growing with the cluster: not judged, one size only")
	}

	small, big := ok[0], ok[0]
	for _, r := range ok {
		if r.Nodes < small.Nodes {
			small = r
		}

		if r.Nodes > big.Nodes {
			big = r
		}
	}

	grows := func(what string, s, b float64) string {
		return fmt.Sprintf("%s per node not growing with the cluster: %s (%.1f at %d nodes, %.1f at %d nodes)",
			what, met(b <= s*targetPerNodeTol), s, small.Nodes, b, big.Nodes)
	}

	return append(out,
		grows("Kubernetes requests", small.KubernetesPerNode, big.KubernetesPerNode),
		grows("Talos calls", small.TalosPerNode, big.TalosPerNode))
}

func writeUpgradeSummary(w io.Writer, r *UpgradeReport) {
	l := r.Latencies
	fmt.Fprintf(w, "%s\n", r.Benchmark)
	fmt.Fprintf(w, "%d CPUs (%s), load average %s at the start; the cluster runs on the same machine\n",
		r.Machine.CPUs, r.Machine.OS, r.Machine.LoadAvgBefore)
	fmt.Fprintf(w, "simulated latencies: static pod restart SPR %s, ready RL %s, kubelet restart KR %s, pod start PS %s, image pull IP %s, "+
		"pod termination T 0 (simulated pods stop at once); Job failure backoff JB %s (kube-controller-manager)\n\n",
		l.StaticPodRestart, l.Ready, l.KubeletRestart, l.PodStart, l.ImagePull, jobFailureBackoff)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODES\tWALL\tBOUND\tRATIO\tLAUNCH/RUN/TAIL\tGAP max (median)\tK8S REQ/NODE\tTALOS/NODE\tRUNNER RSS\tRUNNER CPU")

	for _, x := range r.Results {
		if x.Error != "" {
			fmt.Fprintf(tw, "%d\tfailed: %s\n", x.Nodes, x.Error)

			continue
		}

		fmt.Fprintf(tw, "%d (%d+%d)\t%.1fs\t%.1fs\t%.2f\t%.1f/%.1f/%.1fs\t%.2fs (%.2fs)\t%.1f (%d)\t%.1f (%d)\t%.1f MiB\t%.2fs in %d pod(s)\n",
			x.Nodes, x.ControlPlanes, x.Workers, x.WallSeconds, x.LowerBound.Seconds, x.Ratio,
			x.LaunchSeconds, x.RunSeconds, x.TailSeconds, x.Gaps.LongestSeconds, x.Gaps.MedianSeconds,
			x.KubernetesPerNode, x.KubernetesRequests, x.TalosPerNode, x.TalosCalls, x.RunnerPeakRSSMiB, x.RunnerCPUSeconds, len(x.RunnerPods))
	}

	_ = tw.Flush()

	fmt.Fprintf(w, "\nThe lower bound: every wait the design makes serial, from the simulated latencies, nothing of the tool's own:\n%s\n", boundFormula)
	fmt.Fprintf(w, "(cps control planes, W workers, N nodes, mu = --max-unavailable %d)\n", r.MaxUnavailable)

	for _, x := range r.Results {
		if x.Error != "" {
			continue
		}

		fmt.Fprintf(w, "\nAt %d nodes: bound %.1fs\n", x.Nodes, x.LowerBound.Seconds)

		for _, t := range x.LowerBound.Terms {
			fmt.Fprintf(w, "  %3d x %6.2fs = %6.2fs  %s: %s\n", t.Count, t.Each, t.Seconds, t.Stage, t.What)
		}

		fmt.Fprintf(w, "  each stage, from the previous one's end (the first from the command's start) to its last node verified:\n")

		rest := x.WallSeconds

		for _, st := range x.Stages {
			fmt.Fprintf(w, "    %-24s %6.2fs (bound %6.2fs, %+.2fs)\n", st.Stage, st.Seconds, st.BoundSeconds, st.Seconds-st.BoundSeconds)
			rest -= st.Seconds
		}

		fmt.Fprintf(w, "    %-24s %6.2fs (the command sees the end)\n", "then", rest)

		fmt.Fprintf(w, "  gaps, longest first: a group verified (events.jsonl) to the next group's apply starting (the state's timeline);\n"+
			"  in Kubelets that includes the next batch's cordon and drain; at a stage's start the pre-pull's %s is taken off:\n", l.ImagePull)

		top := slices.Clone(x.Gaps.Gaps)
		sort.SliceStable(top, func(i, j int) bool { return top[i].Seconds > top[j].Seconds })

		for i, g := range top {
			if i == 5 {
				fmt.Fprintf(w, "    ... %d more\n", len(top)-5)

				break
			}

			note := ""
			if g.RunnerReplaced {
				note = "  (a new runner pod took over: not counted)"
			}

			fmt.Fprintf(w, "    %6.2fs  %s: %s -> %s%s\n", g.Seconds, g.Stage, g.From, g.To, note)
		}

		if len(x.Gaps.Missing) > 0 {
			fmt.Fprintf(w, "    not measured (no times): %s\n", strings.Join(x.Gaps.Missing, ", "))
		}

		keys := make([]string, 0, len(x.KubernetesByRequest))
		for k := range x.KubernetesByRequest {
			keys = append(keys, k)
		}

		sort.Slice(keys, func(i, j int) bool { return x.KubernetesByRequest[keys[i]] > x.KubernetesByRequest[keys[j]] })
		fmt.Fprintf(w, "  Kubernetes requests, most first:")

		for i, k := range keys {
			if i == 8 {
				break
			}

			fmt.Fprintf(w, "\n    %5d  %s", x.KubernetesByRequest[k], k)
		}

		fmt.Fprintf(w, "\n  Talos calls: %s\n", breakdownLine(x.TalosByMethod))

		for _, p := range x.RunnerPods {
			fmt.Fprintf(w, "  runner %s on %s: exit %d, %.1f MiB peak, %.2fs CPU, %.1fs wall\n", p.Name, p.Node, p.ExitCode, p.MaxRSSMiB, p.CPUSeconds, p.WallSeconds)
		}
	}

	fmt.Fprintf(w, "\nTargets (never a failure):\n")

	for _, v := range r.Verdict {
		fmt.Fprintf(w, "  %s\n", v)
	}
}

func breakdownLine(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}

	sort.Strings(keys)

	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}

	return strings.Join(parts, ", ")
}
