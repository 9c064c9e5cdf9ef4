package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
)

// requirePause checks err is a *PauseError of stage and node whose reason
// holds every one of reason, with an action to take.
func requirePause(t *testing.T, err error, stage, node string, reason ...string) {
	t.Helper()

	_ = pauseOf(t, err, stage, node, reason...)
}

// pauseOf is requirePause that returns the pause, for more assertions.
func pauseOf(t *testing.T, err error, stage, node string, reason ...string) *PauseError {
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
	p := pauseOf(t, err, "APIServers", "cp-2", "staged for the next reboot", "machine.nodeLabels.rack")
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
			stage:  "APIServers", reason: []string{"checks: version skew: v1.36.3 skips a minor from v1.34.5: upgrade to 1.35 first (on cp-1, cp-2)"},
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
			stage:  "APIServers", reason: []string{"checks: talos pairing: Talos v1.11.5 (on cp-1, cp-2) supports Kubernetes 1.29-1.34, not v1.36.3"},
		},
		{
			name:   "a Talos newer than this build knows",
			spec:   clusterSpec{controlPlanes: 1, kubernetes: "v1.35.4", talos: "v1.15.0"},
			target: "v1.36.3",
			stage:  "APIServers", node: "cp-1", reason: []string{"checks: talos pairing: Talos 1.15 (on cp-1) is newer than this build knows"},
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
			p := pauseOf(t, err, tc.stage, tc.node, tc.reason)
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
				p := pauseOf(t, err, "APIServers", "cp-2", "apiserver version unknown: kube-apiserver on cp-2: image ", "has no vMAJOR.MINOR.PATCH tag (pod kube-system/kube-apiserver-cp-2)")
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
			p := pauseOf(t, err, "APIServers", "cp-3", "apiserver version unknown: kube-apiserver on cp-3: no version (no kube-apiserver mirror pod in kube-system on control plane cp-3)")
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
		p := pauseOf(t, err, "APIServers", "cp-2", `node "cp-2": apply:`, "deadline exceeded")
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
