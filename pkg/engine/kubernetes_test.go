package engine

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config/configloader"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// stageOf names the stage an apply belongs to from what it changed against
// the apply before it on the same node.
type applyStep struct{ node, stage string }

// appliedSteps classifies each real apply by the images it carries: the
// stage is the one whose render the node's config became.
func appliedSteps(t *testing.T, f *fakeCluster, from, to string) []applyStep {
	t.Helper()

	var out []applyStep

	for _, a := range f.realApplies() {
		tag := func(c discovery.Component) string { return render.TagOf(a.images[c]) }

		var stage string

		switch {
		case tag(discovery.Kubelet) == to:
			stage = "Kubelets"
		case tag(discovery.KubeProxy) == to:
			stage = "KubeProxy"
		case tag(discovery.Scheduler) == to && tag(discovery.ControllerManager) == to:
			stage = "ControlPlaneComponents"
		case tag(discovery.APIServer) == to:
			stage = "APIServers"
		default:
			t.Fatalf("apply on %s moves nothing to %s: %v", a.node, to, a.images)
		}

		// Everything a stage does not set stays where it was.
		for _, c := range render.Components() {
			image, ok := a.images[c]
			if !ok {
				continue
			}

			atTarget := map[string][]discovery.Component{
				"APIServers":             {discovery.APIServer},
				"ControlPlaneComponents": {discovery.APIServer, discovery.ControllerManager, discovery.Scheduler},
				"KubeProxy":              {discovery.APIServer, discovery.ControllerManager, discovery.Scheduler, discovery.KubeProxy},
				"Kubelets":               render.Components(),
			}[stage]

			want := from
			if slices.Contains(atTarget, c) {
				want = to
			}

			assert.Equal(t, want, render.TagOf(image), "apply on %s in %s: %s", a.node, stage, c)
		}

		out = append(out, applyStep{node: a.node, stage: stage})
	}

	return out
}

func fullOrder(cps, workers []string) []applyStep {
	var out []applyStep

	for _, stage := range []string{"APIServers", "ControlPlaneComponents", "KubeProxy", "Kubelets"} {
		for _, n := range cps {
			out = append(out, applyStep{n, stage})
		}
	}

	for _, n := range workers {
		out = append(out, applyStep{n, "Kubelets"})
	}

	return out
}

func TestEngineUpgradesInStages(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to string
	}{
		{name: "minor", from: "v1.35.4", to: "v1.36.3"},
		{name: "patch", from: "v1.36.1", to: "v1.36.3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 2, kubernetes: tc.from, workloads: 2})
			before := map[string][]byte{}

			for _, m := range f.machines {
				b, err := m.active.EncodeBytes()
				require.NoError(t, err)

				before[m.name] = b
			}

			rec := &recorder{}
			var out bytes.Buffer

			e := f.engine(tc.to)
			e.Progress, e.Out = rec, &out

			require.NoError(t, e.Run(context.Background()))

			assert.Equal(t, fullOrder([]string{"cp-1", "cp-2", "cp-3"}, []string{"worker-1", "worker-2"}), appliedSteps(t, f, tc.from, tc.to))
			assert.Empty(t, f.invariantHistory(), "the invariant held at every event")

			// Every real apply followed a dry run of the same config.
			for i, a := range f.applies {
				if !a.dryRun {
					require.Positive(t, i)
					assert.True(t, f.applies[i-1].dryRun, "apply %d on %s follows a dry run", i, a.node)
					assert.Equal(t, a.hash, f.applies[i-1].hash)
				}
			}

			// Each node's final config is its old one but for the image tags.
			for _, m := range f.machines {
				old, err := configloader.NewFromBytes(before[m.name])
				require.NoError(t, err)
				require.NoError(t, render.Verify(old, m.active), m.name)

				for c, image := range render.Images(m.active) {
					assert.Equal(t, tc.to, render.TagOf(image), "%s %s", m.name, c)
				}
			}

			// Nodes schedulable, not marked; workloads drained from the workers only.
			nodes, err := f.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
			require.NoError(t, err)

			for _, n := range nodes.Items {
				assert.False(t, n.Spec.Unschedulable, n.Name)
				assert.False(t, kube.CordonedByIchor(&n), n.Name)
				assert.Equal(t, tc.to, n.Status.NodeInfo.KubeletVersion)
			}

			assert.ElementsMatch(t, []string{
				"worker-1 default/web-worker-1-0", "worker-1 default/web-worker-1-1",
				"worker-2 default/web-worker-2-0", "worker-2 default/web-worker-2-1",
			}, f.evictions)
			assert.Equal(t, 1, f.cordonMax, "one node cordoned at a time")

			// The bootstrap manifests were applied by each control plane of the
			// KubeProxy stage, as Talos would, and kube-proxy rolled out.
			// Not forced: nothing another manager owns is taken over; dry-run first.
			assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")
			assert.Contains(t, f.applied, "talos false ClusterRoleBinding /kube-proxy")
			assert.Positive(t, f.dryRuns)
			ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
			require.NoError(t, err)
			assert.Equal(t, "registry.k8s.io/kube-proxy:"+tc.to, ds.Spec.Template.Spec.Containers[0].Image)

			// Pre-pulls: static pods and kube-proxy in the CRI namespace, the
			// kubelet in the system one; kube-proxy on the workers too.
			assert.Contains(t, f.pulls, "cp-1 cri registry.k8s.io/kube-apiserver:"+tc.to)
			assert.Contains(t, f.pulls, "cp-3 cri registry.k8s.io/kube-scheduler:"+tc.to)
			assert.Contains(t, f.pulls, "worker-2 cri registry.k8s.io/kube-proxy:"+tc.to)
			assert.Contains(t, f.pulls, "worker-1 system ghcr.io/siderolabs/kubelet:"+tc.to)

			// Progress: every stage, every phase, one line each.
			assert.Len(t, rec.with("stage "), 4)
			assert.NotEmpty(t, rec.with("Kubelets worker-1 Cordoned"))
			assert.NotEmpty(t, rec.with("Kubelets worker-1 Draining: evicted default/web-worker-1-0"))
			assert.NotEmpty(t, rec.with("APIServers cp-2 Applying: applying kube-apiserver "+tc.from+" -> "+tc.to))
			assert.NotEmpty(t, rec.with("APIServers cp-2 Done: node Ready, kube-apiserver "+tc.to+" Ready"))
			assert.NotEmpty(t, rec.with("Kubelets worker-2 Done: drained 2 pod(s), node Ready, kubelet "+tc.to+", uncordoned"))
			assert.NotEmpty(t, rec.with("KubeProxy [rollout] DaemonSet kube-proxy rolled out on "+tc.to))
			// The stage's own steps are timed, the rollout with its pods.
			assert.NotEmpty(t, rec.with("KubeProxy [pre-pull] time done=true"))
			assert.NotEmpty(t, rec.with("KubeProxy [manifests] time done=true"))
			assert.NotEmpty(t, rec.with("KubeProxy [rollout] time done=false"))
			assert.NotEmpty(t, rec.with("KubeProxy [rollout] time done=true pods=5 updated=5 maxUnavailable=1"))
			assert.Contains(t, out.String(), "Stage 4/4 Kubelets")

			// A second run finds everything done: no apply, only verification.
			n := len(f.realApplies())
			require.NoError(t, f.engine(tc.to).Run(context.Background()))
			assert.Len(t, f.realApplies(), n)
		})
	}
}

func TestEngineOrder(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 4, kubernetes: "v1.35.4"})
	ctx := context.Background()

	label := func(node, order string) {
		n, err := f.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		require.NoError(t, err)

		n.Labels[discovery.OrderLabel] = order
		_, err = f.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	label("cp-3", "1")
	label("worker-4", "1")

	hold, err := f.cs.CoreV1().Nodes().Get(ctx, "worker-3", metav1.GetOptions{})
	require.NoError(t, err)

	hold.Annotations[discovery.HoldAnnotation] = "disk replacement"
	_, err = f.cs.CoreV1().Nodes().Update(ctx, hold, metav1.UpdateOptions{})
	require.NoError(t, err)

	// A batch moves together: the first of a batch to apply waits until the
	// other one is cordoned too.
	f.beforeApply = func(ctx context.Context, m *fakeMachine) {
		if m.name != "worker-1" && m.name != "worker-2" {
			return
		}

		for len(f.cordonedByIchor()) < 2 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Millisecond):
			}
		}
	}

	rec := &recorder{}
	e := f.engine("v1.36.3", func(o *Options) { o.Self, o.MaxUnavailable = "worker-4", 2 })
	e.Progress = rec

	require.NoError(t, e.Run(ctx))

	// Labelled first, then by name; the runner's node last in its group;
	// workers in batches of 2: [worker-1 worker-2] then [worker-4].
	steps := appliedSteps(t, f, "v1.35.4", "v1.36.3")
	assert.Equal(t, fullOrder([]string{"cp-3", "cp-1", "cp-2"}, nil), steps[:12])
	assert.ElementsMatch(t, []applyStep{{"worker-1", "Kubelets"}, {"worker-2", "Kubelets"}}, steps[12:14])
	assert.Equal(t, []applyStep{{"worker-4", "Kubelets"}}, steps[14:])
	assert.Equal(t, 2, f.cordonMax, "at most maxUnavailable workers out at once")

	assert.NotEmpty(t, rec.with("Kubelets worker-3 Held: held (ichor.dev/hold: disk replacement)"))
	assert.Equal(t, "v1.35.4", render.TagOf(render.Images(f.machine("worker-3").active)[discovery.Kubelet]), "a held node is not touched")
	assert.Empty(t, f.invariantHistory())
}

func TestEnginePrePull(t *testing.T) {
	t.Run("a failing pull pauses before the stage's first apply", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
		f.machine("cp-3").faults.pullFails = true

		err := f.engine("v1.36.3").Run(context.Background())
		requirePause(t, err, "APIServers", "", "pre-pull", `node "cp-3": pull registry.k8s.io/kube-apiserver:v1.36.3`, "not found")
		assert.Empty(t, f.realApplies())
	})

	t.Run("a node that cannot pre-pull is skipped", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.machine("worker-1").faults.pullUnsup = true

		rec := &recorder{}
		e := f.engine("v1.36.3")
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		assert.NotEmpty(t, rec.with("Kubelets [pre-pull]", "1 node(s) cannot pre-pull: skipped"))
		requireFinished(t, f, "v1.36.3")
	})
}

func TestEngineOptions(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, kubernetes: "v1.35.4"})

	for _, tc := range []struct {
		name string
		e    *Engine
		err  string
	}{
		{"bad target", f.engine("1.36"), `malformed version "1.36"`},
		{"unknown kind", func() *Engine { e := f.engine("v1.36.3"); e.Options.Kind = "os"; return e }(), `unknown upgrade kind "os"`},
		{"no dynamic client", func() *Engine { e := f.engine("v1.36.3"); e.Dynamic = nil; return e }(), "needs Kube, Dynamic and Talos"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, tc.e.Run(context.Background()), tc.err)
			assert.Empty(t, f.realApplies())
		})
	}

	assert.Equal(t, Options{
		ApplyTimeout: DefaultApplyTimeout, VerifyTimeout: DefaultVerifyTimeout, DrainTimeout: DefaultDrainTimeout,
		UpgradeTimeout: DefaultUpgradeTimeout, RebootTimeout: DefaultRebootTimeout, PullTimeout: DefaultPullTimeout, RenderTimeout: DefaultRenderTimeout,
		MirrorPodTimeout: DefaultMirrorPodTimeout, StartingTimeout: DefaultStartingTimeout, StaticPodSettle: DefaultStaticPodSettle, RolloutStuckAfter: DefaultRolloutStuckAfter,
		UnreachableGrace: DefaultUnreachableGrace,
		Concurrency:      DefaultConcurrency, PullConcurrency: DefaultPullConcurrency, MaxUnavailable: 1,
	}, Options{}.withDefaults())
}

// TestKubeletsStageReadsAheadDuringRollout: the Kubelets stage's reads of the
// nodes' configs are made while the kube-proxy rollout runs, so that its start
// reads none; each visit still reads its node's config before the apply.
func TestKubeletsStageReadsAheadDuringRollout(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 2, kubernetes: "v1.35.4"})
	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	var (
		mu           sync.Mutex
		atStageStart []string // read after the Kubelets stage started, before its first visit
		visits       = map[string]int{}
	)

	f.refuseTalos = func(node, call string) bool {
		if call != "MachineConfig" || len(rec.with("stage 4/4 Kubelets")) == 0 {
			return false
		}

		visiting := len(rec.with("Kubelets cp-1 ")) > 0

		mu.Lock()
		defer mu.Unlock()

		if visiting {
			visits[node]++
		} else {
			atStageStart = append(atStageStart, node)
		}

		if node == "worker-1" && visits[node] == 1 {
			// Another tool changed worker-1's config since it was read ahead (the
			// fake holds its lock while it asks).
			m := f.machine("worker-1")
			patched, err := m.active.PatchV1Alpha1(func(c *v1alpha1.Config) error {
				c.MachineConfig.MachineKubelet.KubeletRegisterWithFQDN = new(true)

				return nil
			})
			require.NoError(t, err)

			m.active, m.persistent = patched, patched
		}

		return false
	}

	require.NoError(t, e.Run(context.Background()))

	assert.Empty(t, atStageStart, "read ahead, while the rollout ran")

	// worker-1's apply was rendered from its config as its visit read it, not as read ahead.
	kubelet := f.machine("worker-1").active.RawV1Alpha1().MachineConfig.MachineKubelet
	assert.True(t, kubelet.KubeletRegisterWithFQDN != nil && *kubelet.KubeletRegisterWithFQDN, "the change made since the read ahead is kept")
	assert.Equal(t, "ghcr.io/siderolabs/kubelet:v1.36.3", kubelet.KubeletImage)

	for _, n := range []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"} {
		assert.Positive(t, visits[n], "%s: its visit reads its config before its apply", n)
	}
}
