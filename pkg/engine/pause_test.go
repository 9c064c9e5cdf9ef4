package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// requirePause checks err is a *PauseError of stage and node whose reason
// holds every one of reason, with an action to take.
func requirePause(t *testing.T, err error, stage, node string, reason ...string) *PauseError {
	t.Helper()

	var pause *PauseError
	require.ErrorAs(t, err, &pause, "want a pause, got %v", err)
	assert.Equal(t, stage, pause.Stage, "stage of %q", pause.Reason)
	assert.Equal(t, node, pause.Node, "node of %q", pause.Reason)

	for _, r := range reason {
		assert.Contains(t, pause.Reason, r)
	}

	assert.NotEmpty(t, pause.Action)
	assert.NotContains(t, pause.Reason, "\n")
	assert.Contains(t, pause.Error(), pause.Reason)

	return pause
}

// appliesOn counts the real applies on node.
func appliesOn(f *fakeCluster, node string) int {
	n := 0

	for _, a := range f.realApplies() {
		if a.node == node {
			n++
		}
	}

	return n
}

// requireFinished checks the cluster ended at target with every node
// schedulable, no node applied twice with the same config, and the
// invariant never broken.
func requireFinished(t *testing.T, f *fakeCluster, target string) {
	t.Helper()

	seen := map[string]bool{}

	for _, a := range f.realApplies() {
		key := a.node + " " + a.hash
		assert.False(t, seen[key], "%s applied the same config twice", a.node)
		seen[key] = true
	}

	for _, m := range f.machines {
		for c, image := range render.Images(m.active) {
			assert.Equal(t, target, render.TagOf(image), "%s %s", m.name, c)
		}
	}

	nodes, err := f.cs.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	for _, n := range nodes.Items {
		assert.False(t, n.Spec.Unschedulable, "%s is schedulable", n.Name)
		assert.False(t, kube.CordonedByIchor(&n), "%s carries no cordon mark", n.Name)
		assert.Equal(t, target, n.Status.NodeInfo.KubeletVersion, n.Name)
	}

	assert.Empty(t, f.invariantHistory())
}

func TestEngineRefusesStagedConfig(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
	cp2 := f.machine("cp-2")

	staged, err := cp2.active.PatchV1Alpha1(func(c *v1alpha1.Config) error {
		c.MachineConfig.MachineNodeLabels = map[string]string{"rack": "r2"}

		return nil
	})
	require.NoError(t, err)

	cp2.persistent = reloadConfig(t, staged)

	err = f.engine("v1.36.3").Run(context.Background())
	p := requirePause(t, err, "APIServers", "cp-2", "staged for the next reboot", "machine.nodeLabels.rack")
	assert.Contains(t, p.Action, "talosctl -n 10.0.0.12 reboot")
	assert.Equal(t, 1, appliesOn(f, "cp-1"))
	assert.Zero(t, appliesOn(f, "cp-2"), "nothing applied over the staged change")

	// Settled (rebooted into it): the next run carries on from cp-2.
	cp2.active = cp2.persistent

	require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
	assert.Equal(t, 4, appliesOn(f, "cp-1"), "cp-1 was not applied again")
	requireFinished(t, f, "v1.36.3")
}

func TestEngineChecksRefuse(t *testing.T) {
	notReady := func(node string) func(*fakeCluster) {
		return func(f *fakeCluster) {
			n, err := f.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
			require.NoError(f.t, err)

			n.Status.Conditions[0].Status = corev1.ConditionFalse
			_, err = f.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
			require.NoError(f.t, err)
		}
	}

	for _, tc := range []struct {
		name       string
		spec       clusterSpec
		target     string
		setup      func(*fakeCluster)
		stage      string
		node       string
		reason     []string
		appliedCPs int // real applies before the pause
	}{
		{
			name:   "a node not Ready",
			spec:   clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"},
			target: "v1.36.3", setup: notReady("worker-2"),
			stage: "Kubelets", node: "worker-2", reason: []string{"checks: not Ready: worker-2"},
			appliedCPs: 3, // the control-plane stages do not visit worker-2
		},
		{
			name:   "a skipped minor",
			spec:   clusterSpec{controlPlanes: 2, kubernetes: "v1.34.5"},
			target: "v1.36.3",
			stage:  "APIServers", reason: []string{"version skew", "cp-1 kube-apiserver", "upgrade to 1.35 first"},
		},
		{
			name:   "a downgrade",
			spec:   clusterSpec{controlPlanes: 2, kubernetes: "v1.36.3"},
			target: "v1.36.1",
			stage:  "APIServers", reason: []string{"version skew", "downgrades are not supported"},
		},
		{
			name:   "a Talos too old for the target",
			spec:   clusterSpec{controlPlanes: 2, kubernetes: "v1.35.4", talos: "v1.11.5"},
			target: "v1.36.3",
			stage:  "APIServers", reason: []string{"talos pairing", "cp-1: talos v1.11.5 does not support kubernetes v1.36.3"},
		},
		{
			name:   "a Talos newer than this build knows",
			spec:   clusterSpec{controlPlanes: 1, kubernetes: "v1.35.4", talos: "v1.15.0"},
			target: "v1.36.3",
			stage:  "APIServers", node: "cp-1", reason: []string{"talos pairing", "v1.15.0"},
		},
		{
			name:   "a node that is not Talos",
			spec:   clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"},
			target: "v1.36.3",
			setup: func(f *fakeCluster) {
				n, err := f.cs.CoreV1().Nodes().Get(context.Background(), "worker-1", metav1.GetOptions{})
				require.NoError(f.t, err)

				n.Status.NodeInfo.OSImage = "Ubuntu 24.04"
				_, err = f.cs.CoreV1().Nodes().UpdateStatus(context.Background(), n, metav1.UpdateOptions{})
				require.NoError(f.t, err)
			},
			stage: "Kubelets", node: "worker-1", reason: []string{`runs "Ubuntu 24.04", not Talos`},
			appliedCPs: 3,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster(t, tc.spec)
			if tc.setup != nil {
				tc.setup(f)
			}

			err := f.engine(tc.target).Run(context.Background())
			requirePause(t, err, tc.stage, tc.node, tc.reason...)
			assert.Len(t, f.realApplies(), tc.appliedCPs)
		})
	}
}

func TestEngineHeldControlPlaneKeepsItsPlace(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})

	n, err := f.cs.CoreV1().Nodes().Get(context.Background(), "cp-3", metav1.GetOptions{})
	require.NoError(t, err)

	n.Annotations[discovery.HoldAnnotation] = "RMA"
	_, err = f.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	err = e.Run(context.Background())

	// Its apiserver stays behind, so no controller-manager may move past it:
	// refused before the apply, not found broken after.
	requirePause(t, err, "ControlPlaneComponents", "cp-1",
		"would break the invariant", "kube-controller-manager v1.36.3 on cp-1", "kube-apiserver v1.35.4 on cp-3")
	assert.NotEmpty(t, rec.with("APIServers cp-3 Held: held (ichor.dev/hold: RMA)"))
	assert.Equal(t, 1, appliesOn(f, "cp-1"))
	assert.Zero(t, appliesOn(f, "cp-3"))
	assert.Empty(t, f.invariantHistory())

	// The pause says to remove the hold and resume, and that is what runs: the
	// resumed run walks the stages from APIServers, cp-3's first apply moves only
	// its apiserver, then the stages one apply each.
	setHold(t, f, "cp-3", "")

	applied := len(f.realApplies())
	before := render.Images(f.machine("cp-3").active)

	require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
	assert.Equal(t, "cp-3", f.realApplies()[applied].node)
	assert.Equal(t, []discovery.Component{discovery.APIServer}, changed(before, f.realApplies()[applied].images))
	assert.Equal(t, 4, appliesOn(f, "cp-3"), "APIServers, ControlPlaneComponents, KubeProxy, Kubelets: one apply each")
	assert.Empty(t, f.invariantHistory())
	requireFinished(t, f, "v1.36.3")
}

// setHold sets (reason not empty) or removes the hold on node.
func setHold(t *testing.T, f *fakeCluster, node, reason string) {
	t.Helper()

	n, err := f.cs.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	require.NoError(t, err)

	if reason == "" {
		delete(n.Annotations, discovery.HoldAnnotation)
	} else {
		n.Annotations[discovery.HoldAnnotation] = reason
	}

	_, err = f.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
	require.NoError(t, err)
}

// changed returns the components whose image differs from before in after.
func changed(before, after map[render.Component]string) []discovery.Component {
	var out []discovery.Component

	for _, c := range discovery.Components() {
		if image, ok := after[c]; ok && before[c] != image {
			out = append(out, c)
		}
	}

	return out
}

// A node whose hold is removed while the Kubelets stage runs (after the stage read
// it as held) is taken by the same run: a run that says it succeeded leaves no node
// behind that it may upgrade.
func TestEngineHoldRemovedDuringKubelets(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	setHold(t, f, "worker-1", "disk")

	var once sync.Once

	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name == "worker-2" {
			once.Do(func() { setHold(t, f, "worker-1", "") })
		}
	}

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotEmpty(t, rec.with("Kubelets worker-1 Held: held (ichor.dev/hold: disk)"))
	assert.NotEmpty(t, rec.with("Kubelets [released] hold removed during the stage: worker-1, taken now"))
	assert.Equal(t, 1, appliesOn(f, "worker-1"))
	assert.Empty(t, f.invariantHistory())
	requireFinished(t, f, "v1.36.3")
}

// An image whose tag says no version in a node's machine config (a suffix; Talos
// refuses a digest-only one there) pauses with what to do, naming the node; nothing
// is moved from it.
func TestEngineImageWithoutVersion(t *testing.T) {
	for name, tc := range map[string]struct {
		node         string
		patch        func(*v1alpha1.Config)
		stage        string
		reason       string
		appliedFirst int
	}{
		"a suffixed controller-manager, pinned in the APIServers stage": {
			node: "cp-2",
			patch: func(c *v1alpha1.Config) {
				c.ClusterConfig.ControllerManagerConfig.ContainerImage = "registry.k8s.io/kube-controller-manager:v1.35.4-custom"
			},
			stage:  "APIServers",
			reason: `kube-controller-manager: image "registry.k8s.io/kube-controller-manager:v1.35.4-custom": no vMAJOR.MINOR.PATCH tag`,
			// The stage renders every node before its first apply.
			appliedFirst: 0,
		},
		"a suffixed kubelet, moved in the Kubelets stage": {
			node: "worker-1",
			patch: func(c *v1alpha1.Config) {
				c.MachineConfig.MachineKubelet.KubeletImage = "ghcr.io/siderolabs/kubelet:v1.35.4-custom"
			},
			stage:        "Kubelets",
			reason:       `version unknown: kubelet on worker-1: image "ghcr.io/siderolabs/kubelet:v1.35.4-custom" has no vMAJOR.MINOR.PATCH tag`,
			appliedFirst: 3, // the control plane's first three stages
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
			if tc.node == "worker-1" {
				f = newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
			}

			m := f.machine(tc.node)
			patched, err := m.active.PatchV1Alpha1(func(c *v1alpha1.Config) error {
				tc.patch(c)

				return nil
			})
			require.NoError(t, err)
			f.mu.Lock()
			m.active, m.persistent = patched, patched
			f.mu.Unlock()

			err = f.engine("v1.36.3").Run(context.Background())
			p := requirePause(t, err, tc.stage, tc.node, tc.reason)
			assert.Contains(t, p.Action, "give the component on "+tc.node+" an image tagged vMAJOR.MINOR.PATCH in its machine config")
			assert.Len(t, f.realApplies(), tc.appliedFirst)
			assert.Zero(t, appliesOn(f, tc.node))
		})
	}
}

func TestEngineInvariant(t *testing.T) {
	// Skew already there (a worker whose kubelet is newer than the apiservers) is
	// reported, not refused: no apply makes it worse, and the upgrade fixes it.
	t.Run("skew before the upgrade", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.takeConfig(f.machine("worker-1"), kubeletAt(t, f.machine("worker-1"), "v1.36.3"))

		rec := &recorder{}
		e := f.engine("v1.36.3")
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		assert.NotEmpty(t, rec.with("APIServers", "skew already there, kept from growing",
			"kubelet v1.36.3 on worker-1 (Node worker-1) is newer than kube-apiserver v1.35.4 on cp-1"))

		for _, m := range f.machines {
			for c, image := range render.Images(m.active) {
				assert.Equal(t, "v1.36.3", render.TagOf(image), "%s %s", m.name, c)
			}
		}

		// The only skew ever seen is the one that was there before.
		for _, broken := range f.invariantHistory() {
			assert.Contains(t, broken, "kubelet v1.36.3 on worker-1 (event) is newer than kube-apiserver v1.35.4 on cp-1")
		}
	})

	t.Run("an apiserver whose version cannot be read", func(t *testing.T) {
		for name, change := range map[string]func(*corev1.Pod){
			"digest only": func(p *corev1.Pod) {
				p.Spec.Containers[0].Image = "registry.k8s.io/kube-apiserver@sha256:" + strings.Repeat("ab", 32)
			},
			"suffixed tag": func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.k8s.io/kube-apiserver:v1.35.4-custom" },
		} {
			t.Run(name, func(t *testing.T) {
				f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
				pods := f.cs.CoreV1().Pods("kube-system")

				pod, err := pods.Get(context.Background(), "kube-apiserver-cp-2", metav1.GetOptions{})
				require.NoError(t, err)
				change(pod)
				_, err = pods.Update(context.Background(), pod, metav1.UpdateOptions{})
				require.NoError(t, err)

				err = f.engine("v1.36.3").Run(context.Background())
				p := requirePause(t, err, "APIServers", "cp-2", "apiserver version unknown: kube-apiserver on cp-2: image ", "has no vMAJOR.MINOR.PATCH tag (pod kube-system/kube-apiserver-cp-2)")
				assert.Contains(t, p.Action, "give kube-apiserver on cp-2 an image tagged vMAJOR.MINOR.PATCH")
				assert.Empty(t, f.realApplies(), "never skipped: nothing applied")
			})
		}

		t.Run("no mirror pod", func(t *testing.T) {
			f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
			require.NoError(t, f.cs.CoreV1().Pods("kube-system").Delete(context.Background(), "kube-apiserver-cp-3", metav1.DeleteOptions{}))

			rec := &recorder{}
			e := f.engine("v1.36.3", func(o *Options) { o.MirrorPodTimeout = 300 * time.Millisecond })
			e.Progress = rec

			err := e.Run(context.Background())
			p := requirePause(t, err, "APIServers", "cp-3", "apiserver version unknown: kube-apiserver on cp-3: no version (no kube-apiserver mirror pod in kube-system on control plane cp-3)")
			assert.Contains(t, p.Action, "kube-apiserver on cp-3 has no mirror pod: a kubelet that just restarted recreates it within seconds")
			assert.Empty(t, f.realApplies())
			assert.NotEmpty(t, rec.with("APIServers [invariant] waiting for the kube-apiserver mirror pod of cp-3"), "the wait is said")
		})

		// A kubelet that restarted on a new version deletes its mirror pods and
		// creates them anew: a mirror pod back within the bound is waited for, not
		// paused on.
		t.Run("a mirror pod recreated within the bound", func(t *testing.T) {
			f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
			pods := f.cs.CoreV1().Pods("kube-system")
			require.NoError(t, pods.Delete(context.Background(), "kube-apiserver-cp-3", metav1.DeleteOptions{}))

			go func() {
				time.Sleep(500 * time.Millisecond)

				_, err := pods.Create(context.Background(), mirrorPod("cp-3", discovery.APIServer, "v1.35.4"), metav1.CreateOptions{})
				assert.NoError(t, err)
			}()

			require.NoError(t, f.engine("v1.36.3", func(o *Options) { o.MirrorPodTimeout = time.Minute }).Run(context.Background()))
			assert.NotEmpty(t, f.realApplies())
		})
	})

	t.Run("broken behind the engine's back during a stage", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
		f.beforeApply = func(_ context.Context, m *fakeMachine) {
			if m.name == "cp-2" {
				w := f.machine("worker-1")
				f.takeConfig(w, kubeletAt(t, w, "v1.36.3"))
			}
		}

		err := f.engine("v1.36.3").Run(context.Background())
		requirePause(t, err, "APIServers", "cp-2", "invariant broken", "kubelet v1.36.3 on worker-1")
	})
}

// kubeletAt returns m's active config with the kubelet at version.
func kubeletAt(t *testing.T, m *fakeMachine, version string) config.Provider {
	t.Helper()

	res, err := render.Render(m.active, render.Versions{render.Kubelet: version})
	require.NoError(t, err)

	return reloadConfig(t, res.Config)
}

func TestEngineTimeouts(t *testing.T) {
	t.Run("an apply that blocks pauses under its own deadline", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
		f.machine("cp-2").faults.applyBlocks = true

		err := f.engine("v1.36.3", func(o *Options) { o.ApplyTimeout = 50 * time.Millisecond }).Run(context.Background())
		p := requirePause(t, err, "APIServers", "cp-2", `node "cp-2": apply:`, "deadline exceeded")
		require.ErrorIs(t, p, context.DeadlineExceeded)
		assert.Zero(t, appliesOn(f, "cp-3"), "nothing after the failed node")

		f.machine("cp-2").faults.applyBlocks = false
		require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
		requireFinished(t, f, "v1.36.3")
	})

	t.Run("a static pod that never gets Ready", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
		f.machine("cp-2").faults.neverReady = []discovery.Component{discovery.Scheduler}

		err := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 100 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "ControlPlaneComponents", "cp-2", "verify: kube-scheduler-cp-2 on v1.36.3 not Ready after 100ms")
		assert.Zero(t, appliesOn(f, "cp-3")-1, "cp-3 is still at its APIServers apply")

		// Fixed by hand: the resumed run verifies cp-2 without applying it again.
		f.machine("cp-2").faults.neverReady = nil
		pod, err := f.cs.CoreV1().Pods("kube-system").Get(context.Background(), "kube-scheduler-cp-2", metav1.GetOptions{})
		require.NoError(t, err)

		pod.Status = readyStatus(true)
		_, err = f.cs.CoreV1().Pods("kube-system").Update(context.Background(), pod, metav1.UpdateOptions{})
		require.NoError(t, err)

		require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
		requireFinished(t, f, "v1.36.3")
	})

	t.Run("a node that stays NotReady after its kubelet", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
		f.machine("worker-1").faults.stayNotReady = true

		err := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 100 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "Kubelets", "worker-1",
			"node NotReady (KubeletNotReady: container runtime network not ready)", "the node stays cordoned")
		assert.Equal(t, []string{"worker-1"}, f.cordonedByIchor())
		assert.Zero(t, appliesOn(f, "worker-2"))

		// Held now: the others go on, and the progress says it stays cordoned.
		n, err := f.cs.CoreV1().Nodes().Get(context.Background(), "worker-1", metav1.GetOptions{})
		require.NoError(t, err)

		n.Annotations[discovery.HoldAnnotation] = "disk"
		_, err = f.cs.CoreV1().Nodes().Update(context.Background(), n, metav1.UpdateOptions{})
		require.NoError(t, err)

		rec := &recorder{}
		e := f.engine("v1.36.3")
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		assert.NotEmpty(t, rec.with("Kubelets worker-1 Held: held (ichor.dev/hold: disk), still cordoned by ichor"))
		assert.Equal(t, 1, appliesOn(f, "worker-2"))
	})

	t.Run("a drain a budget blocks uncordons and pauses", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", workloads: 1})
		f.pdbBlocks = true

		err := f.engine("v1.36.3", func(o *Options) { o.DrainTimeout = 100 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "Kubelets", "worker-1", "global timeout reached", "disruption budget", "(uncordoned again)")
		assert.Empty(t, f.cordonedByIchor())
		assert.Zero(t, appliesOn(f, "worker-1"))

		n, err := f.cs.CoreV1().Nodes().Get(context.Background(), "worker-1", metav1.GetOptions{})
		require.NoError(t, err)
		assert.False(t, n.Spec.Unschedulable)
	})

	t.Run("a rollout that never finishes", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.rolloutStuck = true

		err := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 100 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "KubeProxy", "", "kube-proxy rollout", "0 of 2 pods updated to v1.36.3")
		assert.Zero(t, appliesOn(f, "worker-1"), "no kubelet moves before kube-proxy is rolled out")
	})
}

func TestEngineDrainRefusesUnmanagedPods(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})

	_, err := f.cs.CoreV1().Pods("default").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "debug"},
		Spec:       corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "sh", Image: "busybox"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	err = f.engine("v1.36.3").Run(context.Background())
	requirePause(t, err, "Kubelets", "worker-1", "default/debug", "declare no controller")
	assert.Empty(t, f.cordonedByIchor())
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

func TestEngineKubeProxyDisabled(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 2, workers: 1, kubernetes: "v1.35.4", proxyDisabled: true})

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotEmpty(t, rec.with("KubeProxy [skipped] kube-proxy is disabled"))
	assert.Empty(t, f.applied, "no bootstrap manifests synced")
	assert.Equal(t, fullOrder([]string{"cp-1", "cp-2"}, []string{"worker-1"})[:4], appliedSteps(t, f, "v1.35.4", "v1.36.3")[:4])
	assert.Len(t, f.realApplies(), 2+2+2+1)
	requireFinished(t, f, "v1.36.3")
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
		MirrorPodTimeout: DefaultMirrorPodTimeout, StaticPodSettle: DefaultStaticPodSettle, RolloutStuckAfter: DefaultRolloutStuckAfter,
		Concurrency: DefaultConcurrency, PullConcurrency: DefaultPullConcurrency, MaxUnavailable: 1,
	}, Options{}.withDefaults())
}

// TestEngineResumesFromAnyPoint stops an upgrade after every possible
// number of progress events, then runs a fresh engine: it must finish, never
// apply a config a node already has, and leave nothing cordoned.
func TestEngineResumesFromAnyPoint(t *testing.T) {
	spec := clusterSpec{controlPlanes: 2, workers: 2, kubernetes: "v1.35.4", workloads: 1}

	ref := newFakeCluster(t, spec)
	all := &recorder{}
	e := ref.engine("v1.36.3", func(o *Options) { o.MaxUnavailable = 2 })
	e.Progress = all
	require.NoError(t, e.Run(context.Background()))

	total := len(all.all())
	require.Greater(t, total, 50)
	wantApplies := len(ref.realApplies())

	for stopAt := 1; stopAt <= total; stopAt++ {
		t.Run(fmt.Sprintf("after %d of %d", stopAt, total), func(t *testing.T) {
			t.Parallel()

			f := newFakeCluster(t, spec)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			rec := &recorder{stopAt: stopAt, cancel: cancel}
			first := f.engine("v1.36.3", func(o *Options) { o.MaxUnavailable = 2 })
			first.Progress = rec

			if err := first.Run(ctx); err != nil {
				require.ErrorIs(t, err, context.Canceled, "a stop is not a pause: %v", err)

				var pause *PauseError
				require.False(t, errors.As(err, &pause))
			}

			require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
			assert.Len(t, f.realApplies(), wantApplies, "no node applied twice")
			requireFinished(t, f, "v1.36.3")
		})
	}
}

// TestEngineSurvivesEvictingItself: the runner's pod runs on the node it
// drains; the eviction stops the engine. The next runner (on another node)
// finishes that node first, without applying anything twice.
func TestEngineSurvivesEvictingItself(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 3, kubernetes: "v1.35.4", workloads: 1})

	_, err := f.cs.CoreV1().Pods("ichor-system").Create(context.Background(), &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ichor-system", Name: "ichor-run-abcde",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "ichor-run", Controller: new(true)}},
		},
		Spec: corev1.PodSpec{NodeName: "worker-2", Containers: []corev1.Container{{Name: "run", Image: "ghcr.io/ichor-dev/kubectl-ichor"}}},
	}, metav1.CreateOptions{})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The kubelet stops the runner's container: its context ends.
	f.onEvict = func(ns, name string) {
		if ns == "ichor-system" {
			cancel()
		}
	}

	err = f.engine("v1.36.3", func(o *Options) { o.Self = "worker-2" }).Run(ctx)
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"worker-2"}, f.cordonedByIchor(), "the runner's node stays cordoned by ichor")
	assert.Zero(t, appliesOn(f, "worker-2"))
	assert.Equal(t, 1, appliesOn(f, "worker-3"), "the runner's node went last")

	// The Job's next pod runs on worker-1.
	rec := &recorder{}
	next := f.engine("v1.36.3", func(o *Options) { o.Self = "worker-1" })
	next.Progress = rec

	require.NoError(t, next.Run(context.Background()))
	requireFinished(t, f, "v1.36.3")
	assert.Equal(t, 1, appliesOn(f, "worker-2"))

	kubelets := rec.with("Kubelets ", "Pending")
	require.NotEmpty(t, kubelets)
	assert.Contains(t, rec.with("Kubelets worker-")[0], "worker-2", "the node ichor cordoned is finished first")
}

// A control plane whose hold is removed while the cluster is further on takes the
// stages it missed one apply each, from APIServers: never several stages' worth at
// once. It goes first in the next stage wherever it is in the order: its apiserver
// behind holds back every other controller-manager.
func TestEngineNodeBehindTakesOneStageAtATime(t *testing.T) {
	for name, order := range map[string]map[string]string{
		"first in the order": {"cp-3": "1", "cp-1": "2", "cp-2": "3"},
		"last in the order":  {},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFakeCluster(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4"})
			ctx := context.Background()

			for node, o := range order {
				n, err := f.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
				require.NoError(t, err)

				n.Labels[discovery.OrderLabel] = o
				_, err = f.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
				require.NoError(t, err)
			}

			setHold(t, f, "cp-3", "RMA")

			before := render.Images(f.machine("cp-3").active)

			var once sync.Once

			// The hold goes while the APIServers stage, which read cp-3 as held,
			// applies the last of the others.
			f.beforeApply = func(_ context.Context, m *fakeMachine) {
				if m.name == "cp-2" {
					once.Do(func() { setHold(t, f, "cp-3", "") })
				}
			}

			rec := &recorder{}
			e := f.engine("v1.36.3")
			e.Progress = rec

			require.NoError(t, e.Run(ctx))
			assert.NotEmpty(t, rec.with("ControlPlaneComponents cp-3", "behind the cluster: takes stage APIServers first"))

			applies := f.realApplies()
			require.Len(t, applies, 12, "APIServers, ControlPlaneComponents, KubeProxy, Kubelets: one apply each on each")
			assert.Equal(t, 4, appliesOn(f, "cp-3"))
			// applies[0:2] are the APIServers stage's on cp-1 and cp-2.
			assert.Equal(t, "cp-3", applies[2].node, "cp-3 goes first after the APIServers stage")
			assert.Equal(t, []discovery.Component{discovery.APIServer}, changed(before, applies[2].images))
			assert.Equal(t, "cp-3", applies[3].node)
			assert.Equal(t, []discovery.Component{discovery.ControllerManager, discovery.Scheduler}, changed(applies[2].images, applies[3].images))
			assert.Empty(t, f.invariantHistory())
			requireFinished(t, f, "v1.36.3")
		})
	}
}

// The bootstrap manifests never overwrite what another field manager changed: such an
// object is skipped and said, unless forced by name; an object the runner may not write
// pauses before anything is applied, naming it.
func TestEngineManifestSync(t *testing.T) {
	t.Run("an object changed by another manager is skipped", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.manifestOwners = map[string]string{"ServiceAccount kube-system/kube-proxy": "helm"}

		rec := &recorder{}
		e := f.engine("v1.36.3")
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		assert.NotContains(t, strings.Join(f.applied, "\n"), "ServiceAccount")
		assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")
		assert.NotEmpty(t, rec.with("KubeProxy cp-1", "skipped ServiceAccount kube-system/kube-proxy", `conflict with "helm"`,
			`--manifests-force "ServiceAccount kube-system/kube-proxy"`))
		assert.NotEmpty(t, rec.with("KubeProxy", "skipped 1 changed by another field manager: ServiceAccount kube-system/kube-proxy"))
	})

	t.Run("forced by name, it is taken over", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.manifestOwners = map[string]string{"ServiceAccount kube-system/kube-proxy": "helm"}

		require.NoError(t, f.engine("v1.36.3", func(o *Options) {
			o.ManifestsForce = []string{"ServiceAccount kube-system/kube-proxy"}
		}).Run(context.Background()))
		assert.Contains(t, f.applied, "talos true ServiceAccount kube-system/kube-proxy")
		assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")
	})

	t.Run("an object the runner may not write pauses before anything is applied", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.manifestForbidden = map[string]bool{"ClusterRoleBinding /kube-proxy": true}

		err := f.engine("v1.36.3").Run(context.Background())
		requirePause(t, err, "KubeProxy", "cp-1", "sync bootstrap manifests (0 of 3 applied, nothing after)",
			"dry-run apply ClusterRoleBinding kube-proxy", "forbidden")
		assert.Empty(t, f.applied, "the dry run found it before anything was applied")
	})
}

// Talos re-renders the bootstrap manifests asynchronously after an apply: the sync waits
// until they carry kube-proxy at the target, and pauses when they never do.
func TestEngineManifestsWaitForTheRerender(t *testing.T) {
	t.Run("late", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.staleManifests, f.staleImage = 2, "registry.k8s.io/kube-proxy:v1.35.4"

		require.NoError(t, f.engine("v1.36.3").Run(context.Background()))
		assert.Contains(t, f.applied, "talos false DaemonSet kube-system/kube-proxy")

		ds, err := f.cs.AppsV1().DaemonSets("kube-system").Get(context.Background(), "kube-proxy", metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", ds.Spec.Template.Spec.Containers[0].Image, "never synced the old render")
	})

	t.Run("never", func(t *testing.T) {
		f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4"})
		f.staleManifests, f.staleImage = -1, "registry.k8s.io/kube-proxy:v1.35.4"

		err := f.engine("v1.36.3", func(o *Options) { o.RenderTimeout = 1500 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "KubeProxy", "cp-1", "Talos has not re-rendered the bootstrap manifests for v1.36.3 after 1.5s (kube-proxy image registry.k8s.io/kube-proxy:v1.35.4)")
		assert.Empty(t, f.applied, "the old render is not applied")
	})
}

// A control plane that joins the cluster mid-upgrade (an operator adds it from its
// saved machine config, at the cluster's original versions) after the APIServers
// stage: its Node registers while the ControlPlaneComponents stage applies, its
// mirror pods a moment later. The stage reads the cluster again rather than pause
// on the skew the join brought, and takes the new node first, from the APIServers
// stage, one stage's worth per apply; nothing else is applied before its apiserver
// is on the target, and the run ends with every node there.
func TestEngineControlPlaneJoinsMidUpgrade(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 4, workers: 1, kubernetes: "v1.35.4"})
	ctx := context.Background()

	// cp-4 is not in the cluster yet: no Node, no pods, nothing started.
	require.NoError(t, f.cs.CoreV1().Nodes().Delete(ctx, "cp-4", metav1.DeleteOptions{}))

	for _, c := range discovery.StaticPodComponents() {
		require.NoError(t, f.cs.CoreV1().Pods("kube-system").Delete(ctx, fmt.Sprintf("%s-cp-4", c), metav1.DeleteOptions{}))
	}

	require.NoError(t, f.cs.CoreV1().Pods("kube-system").Delete(ctx, "kube-proxy-cp-4", metav1.DeleteOptions{}))

	f.events = slices.DeleteFunc(f.events, func(e event) bool { return e.node == "cp-4" })
	before := render.Images(f.machine("cp-4").active)

	var (
		once     sync.Once
		joinedAt int // applies before the join
		podsUp   = make(chan struct{})
	)

	join := func() {
		m := f.machine("cp-4")

		_, err := f.cs.CoreV1().Nodes().Create(ctx, f.nodeObject(m, "v1.35.4"), metav1.CreateOptions{})
		require.NoError(t, err)
		f.record("cp-4", string(discovery.Kubelet), "v1.35.4")

		// The static pods come up a moment after the Node registers.
		go func() {
			defer close(podsUp)

			time.Sleep(300 * time.Millisecond)

			for _, c := range discovery.StaticPodComponents() {
				_, err := f.cs.CoreV1().Pods("kube-system").Create(ctx, mirrorPod("cp-4", c, "v1.35.4"), metav1.CreateOptions{})
				assert.NoError(t, err)
				f.record("cp-4", string(c), "v1.35.4")
			}

			_, err := f.cs.CoreV1().Pods("kube-system").Create(ctx, kubeProxyPod("cp-4", "v1.35.4"), metav1.CreateOptions{})
			assert.NoError(t, err)
			f.record("cp-4", string(discovery.KubeProxy), "v1.35.4")
		}()
	}

	// cp-4 joins while the ControlPlaneComponents stage applies on cp-1 (its second
	// apply, recorded before the hook runs).
	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name == "cp-1" && appliesOn(f, "cp-1") == 2 {
			once.Do(func() {
				joinedAt = len(f.realApplies()) - 1
				join()
			})
		}
	}

	rec := &recorder{}
	e := f.engine("v1.36.3")
	e.Progress = rec

	require.NoError(t, e.Run(ctx))
	<-podsUp

	assert.NotEmpty(t, rec.with("ControlPlaneComponents [joined] control plane cp-4 joined during the stage: reading the cluster again, it goes first"))
	assert.NotEmpty(t, rec.with("ControlPlaneComponents cp-4", "behind the cluster: takes stage APIServers first"))

	applies := f.realApplies()
	// applies[joinedAt] is cp-1's ControlPlaneComponents apply, during which cp-4 joined.
	require.Greater(t, len(applies), joinedAt+2)
	assert.Equal(t, "cp-1", applies[joinedAt].node)

	var cp4 []applyCall

	for _, a := range applies {
		if a.node == "cp-4" {
			cp4 = append(cp4, a)
		}
	}

	require.Len(t, cp4, 4, "APIServers, ControlPlaneComponents, KubeProxy, Kubelets: one apply each")
	assert.Equal(t, "cp-4", applies[joinedAt+1].node, "cp-4 goes first once it joined")
	assert.Equal(t, []discovery.Component{discovery.APIServer}, changed(before, cp4[0].images))
	assert.Equal(t, []discovery.Component{discovery.ControllerManager, discovery.Scheduler}, changed(cp4[0].images, cp4[1].images))
	assert.Equal(t, []discovery.Component{discovery.Kubelet}, changed(cp4[2].images, cp4[3].images))

	// The only skew is what the join brought (cp-1's controller-manager, moved
	// before cp-4 came, newer than cp-4's apiserver), until cp-4's first apply.
	for _, broken := range f.invariantHistory() {
		assert.Contains(t, broken, "v1.35.4 on cp-4", broken)
	}

	for _, m := range f.machines {
		for c, image := range render.Images(m.active) {
			assert.Equal(t, "v1.36.3", render.TagOf(image), "%s %s", m.name, c)
		}
	}

	nodes, err := f.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	require.Len(t, nodes.Items, 5)

	for _, n := range nodes.Items {
		assert.False(t, n.Spec.Unschedulable, "%s is schedulable", n.Name)
		assert.Equal(t, "v1.36.3", n.Status.NodeInfo.KubeletVersion, n.Name)
	}
}

// TestEngineNodeJoinedAfterTheLastCheckPauses: a worker registers while the Kubelets
// stage applies its last node, after every stage has read the cluster. The run does not
// say it succeeded: it pauses naming the worker, and the next run upgrades it.
func TestEngineNodeJoinedAfterTheLastCheckPauses(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	ctx := context.Background()

	// worker-2 has no Node yet (the fake's kube-proxy rollout still counts its pod).
	require.NoError(t, f.cs.CoreV1().Nodes().Delete(ctx, "worker-2", metav1.DeleteOptions{}))
	f.events = slices.DeleteFunc(f.events, func(e event) bool { return e.node == "worker-2" })

	var once sync.Once

	f.beforeApply = func(_ context.Context, m *fakeMachine) {
		if m.name != "worker-1" {
			return
		}

		once.Do(func() {
			_, err := f.cs.CoreV1().Nodes().Create(ctx, f.nodeObject(f.machine("worker-2"), "v1.35.4"), metav1.CreateOptions{})
			assert.NoError(t, err)
		})
	}

	err := f.engine("v1.36.3").Run(ctx)

	var pause *PauseError
	require.ErrorAs(t, err, &pause)
	assert.Equal(t, "Kubelets", pause.Stage)
	assert.Equal(t, "worker-2", pause.Node)
	assert.Contains(t, pause.Reason, "worker-2 (kubelet v1.35.4) joined after the stages had read the cluster")
	assert.Contains(t, pause.Action, "the next run takes it through every stage from APIServers")
	assert.Zero(t, appliesOn(f, "worker-2"), "the joined node is not touched by the run that missed it")

	require.NoError(t, f.engine("v1.36.3").Run(ctx), "the next run takes it")
	assert.Equal(t, 1, appliesOn(f, "worker-2"))

	node, err := f.cs.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, "v1.36.3", node.Status.NodeInfo.KubeletVersion)
}

// TestEngineJoinRestartsAreCapped: a control plane whose Node is gone while its mirror
// pods run (a node flapping in and out of the cluster) looks joined at every read of
// the stage. The stage starts again a bounded number of times, then pauses naming it
// rather than loop.
func TestEngineJoinRestartsAreCapped(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 3, workers: 1, kubernetes: "v1.35.4"})
	require.NoError(t, f.cs.CoreV1().Nodes().Delete(context.Background(), "cp-3", metav1.DeleteOptions{}))

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	rec := &recorder{}
	e := f.engine("v1.36.3", func(o *Options) { o.VerifyTimeout = 50 * time.Millisecond })
	e.Progress = rec

	pause := requirePause(t, e.Run(ctx), "APIServers", "cp-3",
		fmt.Sprintf("control planes joined the cluster %d times during the stage (cp-3 %d time(s)), more than the %d restarts a stage takes",
			maxJoinRestarts+1, maxJoinRestarts+1, maxJoinRestarts))
	assert.Contains(t, pause.Action, "kubectl annotate node cp-3 ichor.dev/hold=flapping")
	assert.Len(t, rec.with("APIServers [joined] control plane cp-3 joined during the stage"), maxJoinRestarts)
	assert.Empty(t, f.realApplies(), "nothing applied while the stage could not settle")
}

// TestEngineReleasedReadsTheCache: after the Kubelets stage, a node still held is read
// from the run's watch cache, not fetched from the apiserver; its hold kept, it is
// left alone.
func TestEngineReleasedReadsTheCache(t *testing.T) {
	f := newFakeCluster(t, clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4"})
	setHold(t, f, "worker-1", "disk")
	f.cs.ClearActions()

	require.NoError(t, f.engine("v1.36.3").Run(context.Background()))

	for _, a := range f.cs.Actions() {
		if get, ok := a.(k8stesting.GetAction); ok && a.GetResource().Resource == "nodes" {
			assert.NotEqual(t, "worker-1", get.GetName(), "the held Node is read from the cache")
		}
	}

	assert.Zero(t, appliesOn(f, "worker-1"))
}
