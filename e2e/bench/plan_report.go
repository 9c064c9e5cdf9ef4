package main

// plan_report.go is plan.json's shape, the verdicts against the plan's
// targets and plan.txt.

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is plan.json.
type Report struct {
	Benchmark string    `json:"benchmark"`
	Started   time.Time `json:"started"`
	Machine   Machine   `json:"machine"`
	Runs      int       `json:"runsPerSize"`
	Targets   Targets   `json:"targets"`
	Results   []Result  `json:"results"`
	Verdict   []string  `json:"verdict"`
}

// Targets are the figures to stay under.
type Targets struct {
	// Sizes are the wall time and memory to stay under, at the sizes that
	// have them.
	Sizes              []SizeTarget `json:"sizes"`
	KubernetesRequests string       `json:"kubernetesRequests"`
}

// SizeTarget is the median wall time and the peak memory to stay under at
// a size.
type SizeTarget struct {
	Nodes       int     `json:"nodes"`
	WallSeconds float64 `json:"wallSeconds"`
	PeakRSSMiB  float64 `json:"peakRSSMiB"`
}

// Result is one cluster size.
type Result struct {
	Nodes               int            `json:"nodes"`
	ControlPlanes       int            `json:"controlPlanes"`
	Workers             int            `json:"workers"`
	ClusterStartSeconds float64        `json:"clusterStartSeconds,omitempty"`
	LoadAvgBefore       string         `json:"loadAverageBefore,omitempty"`
	LoadAvgAfter        string         `json:"loadAverageAfter,omitempty"`
	Runs                []Run          `json:"runs,omitempty"`
	Wall                Spread         `json:"wallSeconds"`
	CPU                 Spread         `json:"cpuSeconds"`
	PeakRSSMiB          float64        `json:"peakRSSMiB"`
	KubernetesRequests  int            `json:"kubernetesRequests"`
	KubernetesByRequest map[string]int `json:"kubernetesRequestsByPath,omitempty"`
	TalosCalls          int            `json:"talosCalls"`
	TalosByMethod       map[string]int `json:"talosCallsByMethod,omitempty"`
	TalosNodes          int            `json:"talosNodes"`
	PlanNodes           int            `json:"planNodes"`
	Error               string         `json:"error,omitempty"`
}

// Run is one measured plan.
type Run struct {
	WallSeconds        float64 `json:"wallSeconds"`
	CPUSeconds         float64 `json:"cpuSeconds"`
	PeakRSSMiB         float64 `json:"peakRSSMiB"`
	KubernetesRequests int     `json:"kubernetesRequests"`
	TalosCalls         int     `json:"talosCalls"`
}

// verdict compares the largest size measured with the targets, and the
// Kubernetes request counts across sizes.
func verdict(results []Result) []string {
	var ok []Result
	for _, r := range results {
		if r.Error == "" {
			ok = append(ok, r)
		}
	}
	if len(ok) == 0 {
		return []string{"nothing measured"}
	}
	var out []string
	judged := map[int]bool{}
	for _, r := range ok {
		for _, t := range planTargets {
			if t.nodes != r.Nodes {
				continue
			}
			judged[t.nodes] = true
			out = append(out,
				fmt.Sprintf("wall time under %s at %d nodes: %s (median %.2fs, max %.2fs)", t.wall, r.Nodes, met(r.Wall.Median < t.wall.Seconds()), r.Wall.Median, r.Wall.Max),
				fmt.Sprintf("peak memory under %.0f MiB at %d nodes: %s (%.1f MiB)", t.rssMiB, r.Nodes, met(r.PeakRSSMiB < t.rssMiB), r.PeakRSSMiB))
		}
	}
	var counts []string
	same := true
	for _, r := range ok {
		// The drain preview lists pods in pages of 500: their count grows
		// with the pods, not with the nodes; the kinds of request must not.
		counts = append(counts, fmt.Sprintf("%d (%d kinds) at %d nodes", r.KubernetesRequests, len(r.KubernetesByRequest), r.Nodes))
		same = same && len(r.KubernetesByRequest) == len(ok[0].KubernetesByRequest)
	}
	if len(ok) < 2 {
		out = append(out, fmt.Sprintf("Kubernetes request kinds not growing with the node count: not judged, one size only (%s)", strings.Join(counts, ", ")))
	} else {
		out = append(out, fmt.Sprintf("Kubernetes request kinds not growing with the node count: %s (%s)", met(same), strings.Join(counts, ", ")))
	}
	for _, t := range planTargets {
		if !judged[t.nodes] {
			out = append(out, fmt.Sprintf("the targets at %d nodes: not judged, not measured", t.nodes))
		}
	}
	return out
}

func writeSummary(w io.Writer, r *Report) {
	fmt.Fprintf(w, "%s\n", r.Benchmark)
	fmt.Fprintf(w, "%d measured runs per size after a warm-up; %d CPUs (%s), load average %s at the start (LOAD: the one-minute load average before and after each size's runs); the cluster runs on the same machine\n\n",
		r.Runs, r.Machine.CPUs, r.Machine.OS, r.Machine.LoadAvgBefore)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODES\tLOAD\tCLUSTER START\tWALL median (min-max)\tCPU median\tPEAK RSS\tK8S REQUESTS\tTALOS CALLS")
	for _, x := range r.Results {
		if x.Error != "" {
			fmt.Fprintf(tw, "%d\tfailed: %s\n", x.Nodes, x.Error)
			continue
		}
		fmt.Fprintf(tw, "%d (%d+%d)\t%s-%s\t%.1fs\t%.2fs (%.2f-%.2f)\t%.2fs\t%.1f MiB\t%d\t%d to %d nodes\n",
			x.Nodes, x.ControlPlanes, x.Workers, load1(x.LoadAvgBefore), load1(x.LoadAvgAfter), x.ClusterStartSeconds, x.Wall.Median, x.Wall.Min, x.Wall.Max, x.CPU.Median,
			x.PeakRSSMiB, x.KubernetesRequests, x.TalosCalls, x.TalosNodes)
	}
	_ = tw.Flush()
	if len(r.Results) > 0 {
		last := r.Results[len(r.Results)-1]
		if len(last.KubernetesByRequest) > 0 {
			keys := make([]string, 0, len(last.KubernetesByRequest))
			for k := range last.KubernetesByRequest {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			fmt.Fprintf(w, "\nKubernetes requests at %d nodes:\n", last.Nodes)
			for _, k := range keys {
				fmt.Fprintf(w, "  %s %d\n", k, last.KubernetesByRequest[k])
			}
		}
	}
	fmt.Fprintf(w, "\nTargets (never a failure):\n")
	for _, v := range r.Verdict {
		fmt.Fprintf(w, "  %s\n", v)
	}
}
