package engine

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
	"github.com/ichor-dev/kubectl-ichor/pkg/render"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// talosSpec is a 3+2 cluster on Talos v1.12.4 and Kubernetes v1.35.4 with
// one pod of a workload on each worker.
func talosSpec() clusterSpec {
	return clusterSpec{controlPlanes: 3, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4", workloads: 1}
}

// installerOf is the installer node's upgrade to target uses by default:
// its own installer repository, the tag changed.
func installerOf(t *testing.T, o *fakeOS, node, target string) string {
	t.Helper()

	image, err := render.WithTag(o.f.machine(node).active.Machine().Install().Image(), target)
	require.NoError(t, err)

	return image
}

// requireTalosFinished checks every node not in skip runs target on its
// Node's osImage too, Ready and schedulable, with no cordon mark, each
// upgraded exactly once.
func requireTalosFinished(t *testing.T, o *fakeOS, target string, skip ...string) {
	t.Helper()

	upgrades := o.upgradeNodes()

	for _, fm := range o.f.machines {
		if slices.Contains(skip, fm.name) {
			continue
		}

		st := o.state(fm.name)
		assert.Equal(t, target, st.version, fm.name)
		assert.True(t, st.up, "%s up", fm.name)

		n, err := o.f.cs.CoreV1().Nodes().Get(context.Background(), fm.name, metav1.GetOptions{})
		require.NoError(t, err)
		assert.Equal(t, "Talos ("+target+")", n.Status.NodeInfo.OSImage, fm.name)
		assert.True(t, nodeReady(n), "%s Ready", fm.name)
		assert.False(t, n.Spec.Unschedulable, "%s schedulable", fm.name)
		assert.False(t, kube.CordonedByIchor(n), "%s has no cordon mark", fm.name)
	}

	for _, name := range o.rebootNodes() {
		assert.Equal(t, 1, count(upgrades, name), "%s upgraded once: %v", name, upgrades)
	}
}

func count(list []string, s string) int {
	n := 0

	for _, v := range list {
		if v == s {
			n++
		}
	}

	return n
}

func TestTalosUpgrade(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	memo := newMemo()
	rec := &recorder{}

	e := o.engine("v1.13.9", memo)
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))

	requireTalosFinished(t, o, "v1.13.9")
	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3", "worker-1", "worker-2"}, o.rebootNodes(), "control planes one at a time, then workers")

	o.mu.Lock()
	upgrades, unavailable := slices.Clone(o.upgrades), slices.Clone(o.unavailable)
	o.mu.Unlock()

	for _, u := range upgrades {
		node := strings.Fields(u)[0]
		assert.Equal(t, node+" "+installerOf(t, o, node, "v1.13.9"), u, "the node's installer repository, the target's tag")
	}

	for i, cordoned := range unavailable {
		assert.Equal(t, []string{o.rebootNodes()[i]}, cordoned, "only the node upgraded is cordoned at its Upgrade call")
	}

	// Ichor drained the workers itself (Talos does not on Reboot).
	o.f.mu.Lock()
	evictions := slices.Clone(o.f.evictions)
	o.f.mu.Unlock()
	assert.Contains(t, evictions, "worker-1 default/web-worker-1-0")
	assert.Contains(t, evictions, "worker-2 default/web-worker-2-0")

	// The boot ID was kept before each call, per node and target.
	var mark upgradeMark
	require.NoError(t, json.Unmarshal([]byte(memo.all()["talos/cp-2/v1.13.9"]), &mark))
	assert.Equal(t, "00000001-boot-cp-2-0", mark.BootID)
	assert.Equal(t, stepReboot, mark.Step)

	// One line per phase, as a status shows them.
	done := rec.with("TalosOS cp-1 Done:")
	require.Len(t, done, 1)
	assert.Contains(t, done[0], "Talos v1.12.4 -> v1.13.9 with "+installerOf(t, o, "cp-1", "v1.13.9"))
	assert.Contains(t, done[0], "node Ready on Talos (v1.13.9), etcd member healthy, 3 of 3 voter(s) healthy, uncordoned")
	assert.Contains(t, rec.with("TalosOS worker-1 Done:")[0], "drained 1 pod(s)")
	assert.NotEmpty(t, rec.with("TalosOS cp-1 Upgrading: upgrading Talos v1.12.4 -> v1.13.9"))
	assert.NotEmpty(t, rec.with("stage 1/1 TalosOS"))

	// A second run finds every node on the target and changes nothing.
	require.NoError(t, o.engine("v1.13.9", newMemo()).Run(context.Background()))
	assert.Len(t, o.upgradeNodes(), 5)
}

// TestTalosBootIDFlow: the boot ID is in the state before the Upgrade call;
// a node that stays on its boot for a while after the call is waited for
// (not yet rebooted), not mistaken for done or for a fallback.
func TestTalosBootIDFlow(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
	o.setFaults("worker-1", func(f *osFaults) { f.rebootLag = 200 * time.Millisecond })

	memo := newMemo()
	atCall := map[string]upgradeMark{}

	o.onUpgrade = func(_ context.Context, node string) (bool, error) {
		var mark upgradeMark

		require.NoError(t, json.Unmarshal([]byte(memo.all()["talos/"+node+"/v1.13.9"]), &mark), "the mark is written before the call")

		atCall[node] = mark

		return false, nil
	}

	rec := &recorder{}
	e := o.engine("v1.13.9", memo)
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")

	assert.Equal(t, upgradeMark{BootID: "00000000-boot-cp-1-0", Step: stepInstall, From: "v1.12.4"}, atCall["cp-1"], "the install announced in the boot the node was on")
	assert.Equal(t, upgradeMark{BootID: "00000001-boot-worker-1-0", Step: stepInstall, From: "v1.12.4"}, atCall["worker-1"])
	assert.NotEmpty(t, rec.with("TalosOS worker-1 Upgrading: waiting for the reboot (boot ID unchanged)"))
	assert.Empty(t, rec.with("TalosOS cp-1 Upgrading: waiting for the reboot"), "cp-1 went down at once")

	var mark upgradeMark
	require.NoError(t, json.Unmarshal([]byte(memo.all()["talos/worker-1/v1.13.9"]), &mark))
	assert.Equal(t, upgradeMark{BootID: "00000001-boot-worker-1-0", Step: stepReboot, From: "v1.12.4"}, mark, "the reboot announced once the install ended")
}

func TestTalosUpgradeInstallerOverride(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
	image := "factory.talos.dev/installer/376567988a:v1.13.9"

	require.NoError(t, o.engine("v1.13.9", newMemo(), func(o *Options) { o.Installers = stages.InstallerFlags{Image: image} }).Run(context.Background()))

	o.mu.Lock()
	defer o.mu.Unlock()

	assert.Equal(t, []string{"cp-1 " + image, "worker-1 " + image}, o.upgrades)
}

func TestTalosOrder(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 3, workers: 4, kubernetes: "v1.35.4", talos: "v1.12.4", workloads: 1})
	ctx := context.Background()

	label := func(node, key, value string, annotation bool) {
		n, err := o.f.cs.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		require.NoError(t, err)

		if annotation {
			n.Annotations[key] = value
		} else {
			n.Labels[key] = value
		}

		_, err = o.f.cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		require.NoError(t, err)
	}

	label("cp-3", discovery.OrderLabel, "1", false)
	label("worker-4", discovery.OrderLabel, "0", false)
	label("worker-2", discovery.HoldAnnotation, "RMA", true)

	rec := &recorder{}
	e := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.Self, opts.MaxUnavailable = "cp-3", 2 })
	e.Progress = rec

	require.NoError(t, e.Run(ctx))

	reboots := o.rebootNodes()
	require.Len(t, reboots, 6)
	assert.Equal(t, []string{"cp-1", "cp-2", "cp-3"}, reboots[:3], "the order label puts cp-3 first, but it runs the Job: last")
	assert.ElementsMatch(t, []string{"worker-4", "worker-1"}, reboots[3:5], "the first batch: the labelled worker, then by name")
	assert.Equal(t, "worker-3", reboots[5])
	assert.Equal(t, "v1.12.4", o.state("worker-2").version, "held")
	assert.NotEmpty(t, rec.with("TalosOS worker-2 Held: held (ichor.dev/hold: RMA)"))

	o.mu.Lock()
	unavailable := slices.Clone(o.unavailable)
	o.mu.Unlock()

	for _, cordoned := range unavailable {
		assert.LessOrEqual(t, len(cordoned), 2, "at most MaxUnavailable nodes cordoned: %v", cordoned)

		cps := 0
		for _, n := range cordoned {
			if strings.HasPrefix(n, "cp-") {
				cps++
			}
		}

		assert.LessOrEqual(t, cps, 1, "one control plane at a time: %v", cordoned)
	}

	requireTalosFinished(t, o, "v1.13.9", "worker-2")
}

func TestTalosEtcd(t *testing.T) {
	t.Run("a learner refuses a control plane before anything changes", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())
		o.setFaults("cp-2", func(f *osFaults) { f.learner = true })

		err := o.engine("v1.13.9", newMemo()).Run(context.Background())
		p := pauseOf(t, err, "TalosOS", "cp-1", "checks: etcd is not healthy: member cp-2 a learner (not yet promoted to voter); cp-1 is not rebooted while it is")
		assert.Contains(t, p.Action, "talosctl -n 10.0.0.12 etcd status")
		assert.Empty(t, o.upgradeNodes())
		assert.Empty(t, o.f.cordonedByIchor())
	})

	t.Run("a missing member refuses", func(t *testing.T) {
		o := newFakeOS(t, talosSpec())

		// A fourth control-plane Node that etcd does not list.
		n := o.f.nodeObject(&fakeMachine{name: "cp-4", ip: "10.0.0.14", controlPlane: true, talos: "v1.12.4"}, "v1.35.4")
		n.Annotations[discovery.HoldAnnotation] = "decommissioned"
		_, err := o.f.cs.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{})
		require.NoError(t, err)

		err = o.engine("v1.13.9", newMemo()).Run(context.Background())
		requirePause(t, err, "TalosOS", "cp-1", "etcd is not healthy: control plane cp-4 has no etcd member (its etcd status: ")
		assert.Empty(t, o.upgradeNodes())
	})

	t.Run("a control plane back as a learner is waited for", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.setFaults("cp-1", func(f *osFaults) { f.learnerAfterBoot = 200 * time.Millisecond })

		rec := &recorder{}
		e := o.engine("v1.13.9", newMemo())
		e.Progress = rec

		require.NoError(t, e.Run(context.Background()))
		assert.NotEmpty(t, rec.with("TalosOS cp-1 Verifying: etcd: member cp-1 a learner (not yet promoted to voter)"))
		requireTalosFinished(t, o, "v1.13.9")
	})

	t.Run("a control plane that stays a learner pauses after the bound", func(t *testing.T) {
		o := newFakeOS(t, clusterSpec{controlPlanes: 3, kubernetes: "v1.35.4", talos: "v1.12.4"})
		o.setFaults("cp-1", func(f *osFaults) { f.learnerAfterBoot = time.Hour })

		err := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.RebootTimeout = 300 * time.Millisecond }).Run(context.Background())
		requirePause(t, err, "TalosOS", "cp-1", "verify: etcd: member cp-1 a learner (not yet promoted to voter) after 300ms")
		assert.Equal(t, []string{"cp-1"}, o.upgradeNodes())
	})
}

func TestTalosChecksRefuse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spec   clusterSpec
		target string
		setup  func(*fakeOS)
		node   string
		reason []string
	}{
		{
			name:   "a Talos too old to upgrade from",
			spec:   clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.33.5", talos: "v1.10.7"},
			target: "v1.13.9",
			reason: []string{"checks: upgrade path: cp-1: host version 1.10.7 is too old to upgrade to Talos 1.13.9"},
		},
		{
			name:   "a downgrade",
			spec:   clusterSpec{controlPlanes: 1, kubernetes: "v1.35.4", talos: "v1.13.9"},
			target: "v1.12.4",
			node:   "cp-1",
			reason: []string{"v1.12.4 is older than the running v1.13.9: downgrades are not supported"},
		},
		{
			name:   "a Talos minor this build does not know",
			spec:   clusterSpec{controlPlanes: 1, kubernetes: "v1.35.4", talos: "v1.13.9"},
			target: "v1.15.0",
			node:   "cp-1",
			reason: []string{"checks: upgrade path: Talos 1.15 is newer than this build knows"},
		},
		{
			name:   "a Kubernetes the target does not support",
			spec:   clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.30.14", talos: "v1.12.4"},
			target: "v1.13.9",
			reason: []string{"checks: kubernetes on target: Talos v1.13.9 supports Kubernetes 1.31-1.36: Kubernetes v1.30.14 (kubelet on cp-1) is outside 1.31-1.36"},
		},
		{
			name:   "a node not Ready",
			spec:   clusterSpec{controlPlanes: 1, workers: 2, kubernetes: "v1.35.4", talos: "v1.12.4"},
			target: "v1.13.9",
			setup: func(o *fakeOS) {
				o.setNode("worker-2", func(n *corev1.Node) { n.Status.Conditions[0].Status = corev1.ConditionFalse })
			},
			node:   "worker-2",
			reason: []string{"checks: not Ready: worker-2"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := newFakeOS(t, tc.spec)
			if tc.setup != nil {
				tc.setup(o)
			}

			err := o.engine(tc.target, newMemo()).Run(context.Background())
			requirePause(t, err, "TalosOS", tc.node, tc.reason...)
			assert.Empty(t, o.upgradeNodes())
			assert.Empty(t, o.f.cordonedByIchor())
		})
	}
}

func TestTalosUpgradeCallFails(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.setFaults("cp-2", func(f *osFaults) { f.upgradeFails = true })

	memo := newMemo()

	err := o.engine("v1.13.9", memo).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "cp-2", `node "cp-2": upgrade to `, "the installer exited with code 1", "(uncordoned again)")
	assert.Contains(t, p.Action, "nothing was rebooted")
	assert.Empty(t, o.f.cordonedByIchor())
	assert.Equal(t, []string{"cp-1"}, o.upgradeNodes())

	o.setFaults("cp-2", func(f *osFaults) { f.upgradeFails = false })

	require.NoError(t, o.engine("v1.13.9", memo).Run(context.Background()))
	requireTalosFinished(t, o, "v1.13.9")
}

// TestTalosUpgradeTimeout: the Install call runs out its own bound and the
// node's log shows no install: the call may still be on its way on the node
// (Talos runs an installer to its end whatever its caller does), so the node
// stays cordoned and the pause says an install may be pending; it is never
// uncordoned as if nothing had changed.
func TestTalosUpgradeTimeout(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, workers: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
	o.onUpgrade = func(ctx context.Context, _ string) (bool, error) {
		<-ctx.Done() // the installer outlives the call's deadline

		return true, ctx.Err()
	}

	start := time.Now()
	err := o.engine("v1.13.9", newMemo(), func(opts *Options) { opts.UpgradeTimeout = 100 * time.Millisecond }).Run(context.Background())
	p := pauseOf(t, err, "TalosOS", "cp-1", "the Install call ran out its bound of 100ms", "machined's log says: no install in this boot",
		"an install may be pending", "the node stays cordoned")
	assert.NotContains(t, p.Reason, "uncordoned again")
	assert.Contains(t, p.Action, "talosctl -n 10.0.0.11 logs machined")
	assert.Less(t, time.Since(start), 5*time.Second, "the call had its own deadline")
	assert.Empty(t, o.upgradeNodes())
	assert.Equal(t, []string{"cp-1"}, o.f.cordonedByIchor())
	assert.Zero(t, o.state("cp-1").reboots)
}

func TestTalosAlreadyOnTarget(t *testing.T) {
	o := newFakeOS(t, talosSpec())
	o.setOS("cp-1", "v1.13.9")
	require.NoError(t, kube.Cordon(context.Background(), o.f.cs, "cp-1", time.Now()))

	rec := &recorder{}
	e := o.engine("v1.13.9", newMemo())
	e.Progress = rec

	require.NoError(t, e.Run(context.Background()))
	assert.NotContains(t, o.upgradeNodes(), "cp-1")
	assert.Len(t, o.upgradeNodes(), 4)
	assert.NotEmpty(t, rec.with("TalosOS cp-1 Pending: on Talos v1.13.9: to verify"))
	assert.NotEmpty(t, rec.with("TalosOS cp-1 Done: on Talos v1.13.9 already", "uncordoned"))
	requireTalosFinished(t, o, "v1.13.9")
}

func TestTalosNeedsMemo(t *testing.T) {
	o := newFakeOS(t, clusterSpec{controlPlanes: 1, kubernetes: "v1.35.4", talos: "v1.12.4"})
	e := o.engine("v1.13.9", nil)
	e.Memo = nil

	require.ErrorContains(t, e.Run(context.Background()), "the Talos upgrade needs a Memo")
	assert.Empty(t, o.upgradeNodes())
}
