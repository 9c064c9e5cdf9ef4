package main

// bound.go is the simulated latencies the upgrade benchmark fixes and the
// upgrade's lower bound: the critical path the design makes serial, from
// those latencies alone.

import (
	"encoding/json"
	"fmt"
	"time"
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
	ManifestRender:   3 * time.Second,
}

const (
	// jobFailureBackoff is the Job controller's delay before it replaces a
	// failed pod (kube-controller-manager's DefaultJobPodFailureBackOff,
	// not configurable): it counts failures its podFailurePolicy ignores
	// too. A Kubernetes upgrade's runner stays on its node, so it is in no
	// bound; a replacement seen in a run is the tool's excess.
	jobFailureBackoff = 10 * time.Second
)

// Latencies are the simulator's latencies (ichor-sim up flags).
type Latencies struct {
	StaticPodRestart time.Duration
	Ready            time.Duration
	KubeletRestart   time.Duration
	PodStart         time.Duration
	ImagePull        time.Duration
	Reboot           time.Duration
	// ManifestRender is how long after a config change a control plane re-renders
	// its bootstrap manifests (Talos' controllers, asynchronously).
	ManifestRender time.Duration
	// PodTermination is how long an evicted pod takes to stop (T): 0, the
	// simulated pods stop at once, unless --pod-termination sets every node's
	// terminationTakes fault (podTerminationFaults).
	PodTermination time.Duration
}

func (l Latencies) flags() []string {
	return []string{
		"--static-pod-restart", l.StaticPodRestart.String(), "--ready-latency", l.Ready.String(),
		"--kubelet-restart", l.KubeletRestart.String(), "--pod-start", l.PodStart.String(),
		"--image-pull", l.ImagePull.String(), "--reboot", l.Reboot.String(),
		"--manifest-render", l.ManifestRender.String(),
	}
}

// MarshalJSON writes the latencies in seconds.
func (l Latencies) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]float64{
		"staticPodRestartSeconds": l.StaticPodRestart.Seconds(), "readySeconds": l.Ready.Seconds(),
		"kubeletRestartSeconds": l.KubeletRestart.Seconds(), "podStartSeconds": l.PodStart.Seconds(),
		"imagePullSeconds": l.ImagePull.Seconds(), "rebootSeconds": l.Reboot.Seconds(),
		"manifestRenderSeconds": l.ManifestRender.Seconds(),
		"podTerminationSeconds": l.PodTermination.Seconds(), "jobFailureBackoffSeconds": jobFailureBackoff.Seconds(),
	})
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

// lowerBound is the upgrade's critical path on a cluster of cps control
// planes and workers, maxUnavailable at a time: every wait the design makes
// serial and the cluster does at its own pace, nothing the tool adds.
//
//	bound = PS                                  the first runner pod starts
//	      + IP                                  the first stage's pre-pull, every node at once (each
//	                                            later stage's images pull while the stage before runs)
//	      + cps x (SPR + RL)                    APIServers: one control plane at a time, its apiserver restarts and gets Ready
//	      + cps x (SPR + RL)                    ControlPlaneComponents: controller-manager and scheduler restart together
//	      + MR                                  KubeProxy: Talos re-renders the bootstrap manifests after the first
//	                                            control plane's apply; their sync starts the rollout
//	      + N x max(T + PS + RL, DS)            KubeProxy: the DaemonSet rolls one pod at a time (maxUnavailable 1),
//	                                            at the DaemonSet controller's pace DS when measured; the control
//	                                            planes' applies restart no static pod and overlap it
//	      + cps x (KR + SPR + RL)               Kubelets: one control plane at a time: drain (of nothing: the
//	                                            workload runs on the workers), kubelet restart, and the static
//	                                            pods the new kubelet restarts, Ready again
//	      + ceil(W / mu) x (T + KR)             Kubelets: then mu workers at a time: drain, kubelet restart
//
// with SPR the static pod restart, RL the ready latency, KR the kubelet
// restart, PS the pod start, IP the image pull, MR the manifests' re-render, T the pod
// termination (Latencies.PodTermination), N the nodes and W the workers. DS is the cluster's own:
// the median time between two kube-proxy pods starting on the target, from
// the simulator's events (the DaemonSet controller sees the last pod Ready,
// deletes the next, waits for it to go and creates its replacement); 0 when
// not measured. The runner's own node costs nothing more: a kubelet restart
// leaves the runner's container running, so no replacement pod waits out the
// Job controller's failure backoff.
func lowerBound(l Latencies, cps, workers, maxUnavailable int, ds time.Duration) Bound {
	n := cps + workers
	spr, rl, kr, ps, ip := l.StaticPodRestart.Seconds(), l.Ready.Seconds(), l.KubeletRestart.Seconds(), l.PodStart.Seconds(), l.ImagePull.Seconds()
	mr := l.ManifestRender.Seconds()
	t := l.PodTermination.Seconds()
	batches := (workers + maxUnavailable - 1) / maxUnavailable

	rollout := BoundTerm{Stage: "KubeProxy", What: "the DaemonSet replaces one pod at a time (T + PS + RL)", Count: n, Each: t + ps + rl}
	if ds.Seconds() > rollout.Each {
		rollout.What, rollout.Each = fmt.Sprintf("the DaemonSet replaces one pod at a time, at its controller's measured pace (DS %s)", ds.Round(10*time.Millisecond)), ds.Seconds()
	}

	terms := []BoundTerm{
		{Stage: "APIServers", What: "the first runner pod starts (PS)", Count: 1, Each: ps},
		{Stage: "APIServers", What: "pre-pull (IP)", Count: 1, Each: ip},
		{Stage: "APIServers", What: "a control plane's apiserver restarts and gets Ready (SPR + RL)", Count: cps, Each: spr + rl},
		{Stage: "ControlPlaneComponents", What: "its controller-manager and scheduler restart and get Ready (SPR + RL)", Count: cps, Each: spr + rl},
		{Stage: "KubeProxy", What: "Talos re-renders the bootstrap manifests after the first control plane's apply, then their sync starts the rollout (MR)", Count: 1, Each: mr},
		rollout,
		{Stage: "Kubelets", What: "a control plane: drain (nothing to evict), kubelet restart, its static pods restarted by the new kubelet and Ready (KR + SPR + RL)", Count: cps, Each: kr + spr + rl},
		{Stage: "Kubelets", What: fmt.Sprintf("then %d workers at a time: drain, kubelet restart (T + KR)", maxUnavailable), Count: batches, Each: t + kr},
	}

	return sumTerms(terms)
}

// sumTerms is the bound of terms, each rounded.
func sumTerms(terms []BoundTerm) Bound {
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
const boundFormula = `bound = PS + IP + cps x (SPR + RL) + cps x (SPR + RL) + MR + N x max(T + PS + RL, DS)
        + cps x (KR + SPR + RL) + ceil(W / mu) x (T + KR)`

// talosBound is a Talos OS upgrade's critical path on a cluster of cps
// control planes and workers, maxUnavailable at a time:
//
//	bound = PS                                      the first runner pod starts
//	      + IP                                      the installer's pre-pull, every node at once
//	      + cps x (IP + RB + RL)                    one control plane at a time: its drain (of
//	                                                nothing: the workload runs on the workers), the
//	                                                installer writes the other boot slot (IP in the
//	                                                simulator), the reboot, Node Ready on the new
//	                                                Talos, etcd healthy
//	      + ceil(W / mu) x (max(T, IP) + RB + RL)   then mu workers at a time: their drains' pods
//	                                                stop while they install, then as above
//
// with RB the reboot (down to booted again) and the rest as lowerBound's. On
// Talos 1.13 and later an install leaves the node's pods running: it starts
// once the drain's evictions are accepted, and the reboot waits for the pods
// to be gone. The runner's own node reboots, so the runner leaves it before:
// the Job's replacement pod and its failure backoff are the tool's, in no
// bound.
func talosBound(l Latencies, cps, workers, maxUnavailable int) Bound {
	ip, rb, rl, ps := l.ImagePull.Seconds(), l.Reboot.Seconds(), l.Ready.Seconds(), l.PodStart.Seconds()
	t := l.PodTermination.Seconds()
	batches := (workers + maxUnavailable - 1) / maxUnavailable

	return sumTerms([]BoundTerm{
		{Stage: "TalosOS", What: "the first runner pod starts (PS)", Count: 1, Each: ps},
		{Stage: "TalosOS", What: "the installer's pre-pull, every node at once (IP)", Count: 1, Each: ip},
		{Stage: "TalosOS", What: "a control plane: drain (nothing to evict), install, reboot, Ready on the new Talos with etcd healthy (IP + RB + RL)", Count: cps, Each: ip + rb + rl},
		{Stage: "TalosOS", What: fmt.Sprintf("then %d workers at a time: drain and install side by side, reboot, Ready (max(T, IP) + RB + RL)", maxUnavailable), Count: batches, Each: max(t, ip) + rb + rl},
	})
}

// talosBoundFormula is talosBound's formula, for the summary.
const talosBoundFormula = `bound = PS + IP + cps x (IP + RB + RL) + ceil(W / mu) x (max(T, IP) + RB + RL)`
