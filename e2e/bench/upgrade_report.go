package main

// upgrade_report.go is upgrade.json's shape, the verdicts against the
// upgrade's targets and upgrade.txt.

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// Targets of the upgrade benchmark (issue 28), reported, never asserted.
const (
	targetRatio      = 1.05
	targetSlack      = 0 * time.Second
	targetGap        = 500 * time.Millisecond
	targetRunnerMiB  = 128
	targetPerNodeTol = 1.10 // per-node requests at the larger size at most this times the smaller's
	// targetPeerRatio is kubectl-ichor's wall one worker at a time, drains
	// included, over talosctl upgrade-k8s's on an identical cluster.
	targetPeerRatio = 0.75
)

// UpgradeReport is upgrade.json.
type UpgradeReport struct {
	Benchmark string `json:"benchmark"`
	// Formula is the lower bound's, in the latencies' letters.
	Formula        string          `json:"boundFormula"`
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
	Nodes         int `json:"nodes"`
	ControlPlanes int `json:"controlPlanes"`
	Workers       int `json:"workers"`
	WorkloadPods  int `json:"workloadPods"`
	// MaxUnavailable is the workers upgraded at once (--max-unavailable).
	MaxUnavailable      int     `json:"maxUnavailable"`
	ClusterStartSeconds float64 `json:"clusterStartSeconds,omitempty"`
	LoadAvgBefore       string  `json:"loadAverageBefore,omitempty"`
	LoadAvgAfter        string  `json:"loadAverageAfter,omitempty"`

	// WallSeconds is the upgrade command's, from its start to its exit.
	WallSeconds float64 `json:"wallSeconds"`
	// Talosctl is the peer, talosctl upgrade-k8s, on an identical cluster
	// (with --compare), and RatioToTalosctl this wall over its wall.
	Talosctl        *PeerResult `json:"talosctl,omitempty"`
	RatioToTalosctl float64     `json:"ratioToTalosctl,omitempty"`
	// Timeline is the run's picture, a file beside upgrade.json.
	Timeline string `json:"timeline,omitempty"`
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

// RunnerPod is what one runner pod used, from its usage.json (CPU, wall, exit code)
// and its log (its node, its requests, and its own peak resident memory: see
// runnerPeakRE).
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

	for _, r := range ok {
		limit := targetRatio*r.LowerBound.Seconds + targetSlack.Seconds()
		out = append(out,
			fmt.Sprintf("%s: wall time at most %.2f x bound + %s = %.1fs: %s (%.1fs, %.2f x the bound of %.1fs)",
				runLabel(r), targetRatio, targetSlack, limit, met(r.WallSeconds <= limit), r.WallSeconds, r.Ratio, r.LowerBound.Seconds),
			fmt.Sprintf("%s: no gap over %s: %s (longest %.2fs, median %.2fs, over %d gaps)",
				runLabel(r), targetGap, met(r.Gaps.LongestSeconds <= targetGap.Seconds()), r.Gaps.LongestSeconds, r.Gaps.MedianSeconds, len(r.Gaps.Gaps)),
			estimateVerdict(r),
			fmt.Sprintf("%s: runner under %d MiB: %s (peak %.1f MiB over %d pod(s))",
				runLabel(r), targetRunnerMiB, met(r.RunnerPeakRSSMiB < targetRunnerMiB), r.RunnerPeakRSSMiB, len(r.RunnerPods)))
	}

	out = append(out, peerVerdict(ok)...)

	// Requests per node, between sizes run alike.
	byMU := map[int][]UpgradeResult{}
	var mus []int

	for _, r := range ok {
		if byMU[r.MaxUnavailable] == nil {
			mus = append(mus, r.MaxUnavailable)
		}

		byMU[r.MaxUnavailable] = append(byMU[r.MaxUnavailable], r)
	}

	for _, mu := range mus {
		out = append(out, perNodeVerdict(byMU[mu], mu)...)
	}

	return out
}

// perNodeVerdict holds the requests per node of the smallest and the
// largest size against each other.
func perNodeVerdict(ok []UpgradeResult, mu int) []string {
	if len(ok) < 2 {
		return []string{fmt.Sprintf("--max-unavailable %d: requests per node not growing with the cluster: not judged, one size only", mu)}
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
		return fmt.Sprintf("--max-unavailable %d: %s per node not growing with the cluster: %s (%.1f at %d nodes, %.1f at %d nodes)",
			mu, what, met(b <= s*targetPerNodeTol), s, small.Nodes, b, big.Nodes)
	}

	return []string{
		grows("Kubernetes requests", small.KubernetesPerNode, big.KubernetesPerNode),
		grows("Talos calls", small.TalosPerNode, big.TalosPerNode),
	}
}

// peerVerdict holds kubectl-ichor's wall, one worker at a time as the peer
// moves its kubelets, against talosctl upgrade-k8s's on an identical
// cluster; the runs at a higher --max-unavailable are reported beside it.
func peerVerdict(ok []UpgradeResult) []string {
	var out []string

	for _, r := range ok {
		p := r.Talosctl
		if p == nil {
			continue
		}

		if p.Error != "" {
			out = append(out, fmt.Sprintf("%s: against talosctl upgrade-k8s: not judged, the peer's run failed", runLabel(r)))

			continue
		}

		if r.MaxUnavailable == 1 {
			out = append(out, fmt.Sprintf("%s: at most %.2f x talosctl upgrade-k8s's wall: %s (%.1fs against %.1fs: %.2f x)",
				runLabel(r), targetPeerRatio, met(r.RatioToTalosctl <= targetPeerRatio), r.WallSeconds, p.WallSeconds, r.RatioToTalosctl))
		} else {
			out = append(out, fmt.Sprintf("%s: %.2f x talosctl upgrade-k8s's wall (%.1fs against %.1fs; the target is one worker at a time's)",
				runLabel(r), r.RatioToTalosctl, r.WallSeconds, p.WallSeconds))
		}
	}

	return out
}

// runLabel names a run in the verdicts.
func runLabel(r UpgradeResult) string {
	return fmt.Sprintf("%d nodes, --max-unavailable %d", r.Nodes, r.MaxUnavailable)
}

func writeUpgradeSummary(w io.Writer, r *UpgradeReport) {
	l := r.Latencies
	fmt.Fprintf(w, "%s\n", r.Benchmark)
	fmt.Fprintf(w, "%d CPUs (%s), load average %s at the start (LOAD: the one-minute load average at each run's start and end); the cluster runs on the same machine\n",
		r.Machine.CPUs, r.Machine.OS, r.Machine.LoadAvgBefore)
	fmt.Fprintf(w, "simulated latencies: static pod restart SPR %s, ready RL %s, kubelet restart KR %s, pod start PS %s, image pull (and a Talos install) IP %s, "+
		"reboot RB %s, manifest re-render MR %s, pod termination T %s; Job failure backoff JB %s (kube-controller-manager)\n\n",
		l.StaticPodRestart, l.Ready, l.KubeletRestart, l.PodStart, l.ImagePull, l.Reboot, l.ManifestRender, podTerminationText(l.PodTermination), jobFailureBackoff)

	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODES\tMU\tLOAD\tWALL\tBOUND\tRATIO\tTALOSCTL\tx TALOSCTL\tLAUNCH/RUN/TAIL\tGAP max (median)\tK8S REQ/NODE\tTALOS/NODE\tRUNNER RSS\tRUNNER CPU")

	for _, x := range r.Results {
		if x.Error != "" {
			fmt.Fprintf(tw, "%d\t%d\tfailed: %s\n", x.Nodes, x.MaxUnavailable, x.Error)

			continue
		}

		fmt.Fprintf(tw, "%d (%d+%d)\t%d\t%s-%s\t%.1fs\t%.1fs\t%.2f\t%s\t%s\t%.1f/%.1f/%.1fs\t%.2fs (%.2fs)\t%.1f (%d)\t%.1f (%d)\t%.1f MiB\t%.2fs in %d pod(s)\n",
			x.Nodes, x.ControlPlanes, x.Workers, x.MaxUnavailable, load1(x.LoadAvgBefore), load1(x.LoadAvgAfter), x.WallSeconds, x.LowerBound.Seconds, x.Ratio, peerWall(x), peerRatio(x),
			x.LaunchSeconds, x.RunSeconds, x.TailSeconds, x.Gaps.LongestSeconds, x.Gaps.MedianSeconds,
			x.KubernetesPerNode, x.KubernetesRequests, x.TalosPerNode, x.TalosCalls, x.RunnerPeakRSSMiB, x.RunnerCPUSeconds, len(x.RunnerPods))
	}

	_ = tw.Flush()

	writePeerSummary(w, r.Results)

	fmt.Fprintf(w, "\nThe lower bound: every wait the design makes serial, from the simulated latencies, nothing of the tool's own:\n%s\n", r.Formula)
	fmt.Fprintf(w, "(cps control planes, W workers, N nodes, mu = --max-unavailable)\n")

	for _, x := range r.Results {
		if x.Error != "" {
			continue
		}

		fmt.Fprintf(w, "\nAt %d nodes, --max-unavailable %d: bound %.1fs; timeline %s\n", x.Nodes, x.MaxUnavailable, x.LowerBound.Seconds, x.Timeline)

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
			"  in Kubelets that includes the next batch's cordon and drain, less T when an evicted pod of the batch stopped in it;\n"+
			"  a stage's images were pulled while the stage before ran:\n")

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

// peerWall and peerRatio are the table's peer columns.
func peerWall(x UpgradeResult) string {
	switch {
	case x.Talosctl == nil:
		return "-"
	case x.Talosctl.Error != "":
		return "failed"
	}

	return fmt.Sprintf("%.1fs", x.Talosctl.WallSeconds)
}

func peerRatio(x UpgradeResult) string {
	if x.RatioToTalosctl == 0 {
		return "-"
	}

	return fmt.Sprintf("%.2f", x.RatioToTalosctl)
}

// writePeerSummary says how the peer ran, once per size.
func writePeerSummary(w io.Writer, results []UpgradeResult) {
	seen := map[*PeerResult]bool{}

	for _, x := range results {
		p := x.Talosctl
		if p == nil || seen[p] {
			continue
		}

		seen[p] = true

		if p.Error != "" {
			fmt.Fprintf(w, "\n%s at %d nodes (an identical cluster): failed: %s\n", p.Command, x.Nodes, p.Error)

			continue
		}

		fmt.Fprintf(w, "\n%s at %d nodes (an identical cluster, no drains, kubelets one at a time): %.1fs, load average %s at its start, %s at its end; timeline %s\n",
			p.Command, x.Nodes, p.WallSeconds, p.LoadAvgBefore, p.LoadAvgAfter, p.Timeline)
	}
}

// podTerminationText says T as the summary does.
func podTerminationText(d time.Duration) string {
	if d == 0 {
		return "0 (simulated pods stop at once)"
	}

	return d.String() + " (every node's terminationTakes: an evicted pod stops that long after)"
}
