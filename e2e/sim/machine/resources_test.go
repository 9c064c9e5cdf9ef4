package machine_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	"github.com/siderolabs/talos/pkg/machinery/resources/cluster"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/etcd"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/siderolabs/talos/pkg/machinery/resources/runtime"
	v1alpha1res "github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// watch starts a COSI watch of one resource and returns its events as they
// come.
func watch(t *testing.T, st state.State, ptr resource.Pointer) <-chan state.Event {
	t.Helper()
	ch := make(chan state.Event, 64)
	require.NoError(t, st.Watch(t.Context(), ptr, ch))
	return ch
}

func next(t *testing.T, ch <-chan state.Event, what string) state.Event {
	t.Helper()
	select {
	case ev := <-ch:
		return ev
	case <-time.After(10 * time.Second):
		t.Fatalf("no watch event: %s", what)
		return state.Event{}
	}
}

func serviceSpec(t *testing.T, ev state.Event) v1alpha1res.ServiceSpec {
	t.Helper()
	svc, ok := ev.Resource.(*v1alpha1res.Service)
	require.True(t, ok, "a Service, not %T", ev.Resource)
	return *svc.TypedSpec()
}

// resolve finds a resource definition by name or alias, as machinery's
// Client.ResolveResourceKind does (through the meta namespace).
func resolve(t *testing.T, st state.State, name string) (*meta.ResourceDefinition, bool) {
	t.Helper()
	rds, err := safe.StateListAll[*meta.ResourceDefinition](t.Context(), st)
	require.NoError(t, err)
	for rd := range rds.All() {
		if strings.EqualFold(rd.Metadata().ID(), name) {
			return rd, true
		}
		for _, a := range rd.TypedSpec().AllAliases {
			if strings.EqualFold(a, name) {
				return rd, true
			}
		}
	}
	return nil, false
}

// Talos registers its resource definitions and namespaces in the meta
// namespace, where clients resolve the names and aliases operators type; a
// Talos 1.13 machine has none of the types that came with 1.14.
func TestMetaNamespace(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	st := f.m.COSI()
	for name, typ := range map[string]resource.Type{
		"machineconfig":   configres.MachineConfigType,
		"members":         cluster.MemberType,
		"services":        v1alpha1res.ServiceType,
		"svc":             v1alpha1res.ServiceType,
		"staticpodstatus": k8s.StaticPodStatusType,
		"podstatus":       k8s.StaticPodStatusType,
		"machinestatus":   runtime.MachineStatusType,
		"nodename":        k8s.NodenameType,
		"version":         runtime.VersionType,
		"etcdmember":      etcd.MemberType,
		"manifests":       k8s.ManifestType,
	} {
		rd, ok := resolve(t, st, name)
		if assert.True(t, ok, "%s resolves", name) {
			assert.Equal(t, typ, rd.TypedSpec().Type, name)
		}
	}
	rd, _ := resolve(t, st, "machineconfig")
	assert.Equal(t, meta.Sensitive, rd.TypedSpec().Sensitivity)
	assert.Equal(t, configres.NamespaceName, rd.TypedSpec().DefaultNamespace)
	_, ok := resolve(t, st, "imagefactoryschematic")
	assert.False(t, ok, "a Talos 1.12 machine has no 1.14 types")
	_, err := safe.StateGetByID[*meta.Namespace](t.Context(), st, "containers")
	assert.True(t, state.IsNotFoundError(err), "nor 1.14 namespaces")
	_, err = safe.StateGetByID[*meta.Namespace](t.Context(), st, k8s.ControlPlaneNamespaceName)
	require.NoError(t, err)

	// After an upgrade to 1.14 and its reboot, the definitions are 1.14's.
	stageInstall(t, f.m, installer1141)
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	_, ok = resolve(t, f.m.COSI(), "imagefactoryschematic")
	assert.True(t, ok)
}

// A kubelet restart, as Talos does it for a new KubeletSpec, is seen by a
// watcher of the kubelet Service as Destroyed (the service stopped), Created
// running but not healthy (its health was lost with the stop), then Updated
// healthy once the first health check passes: what talosctl upgrade-k8s
// waits for. Meanwhile the machine reports the kubelet not running.
func TestKubeletRestartDestroysAndCreatesItsService(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	ptr := v1alpha1res.NewService("kubelet").Metadata()
	events := watch(t, f.m.COSI(), ptr)
	first := next(t, events, "initial")
	require.Equal(t, state.Created, first.Type)
	if !serviceSpec(t, first).Healthy {
		ev := next(t, events, "first health check")
		require.Equal(t, state.Updated, ev.Type)
		assert.Equal(t, v1alpha1res.ServiceSpec{Running: true, Healthy: true}, serviceSpec(t, ev))
	}

	const img = "ghcr.io/siderolabs/kubelet:v1.36.3"
	_, err := f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.MachineConfig.MachineKubelet.KubeletImage = img }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)

	ev := next(t, events, "kubelet stopped")
	require.Equal(t, state.Destroyed, ev.Type)
	assert.False(t, f.m.State().KubeletRunning)
	ev = next(t, events, "kubelet started")
	require.Equal(t, state.Created, ev.Type)
	assert.Equal(t, v1alpha1res.ServiceSpec{Running: true, Healthy: false, Unknown: false}, serviceSpec(t, ev))
	ev = next(t, events, "kubelet healthy")
	require.Equal(t, state.Updated, ev.Type)
	assert.Equal(t, v1alpha1res.ServiceSpec{Running: true, Healthy: true}, serviceSpec(t, ev))
	assert.True(t, f.m.State().KubeletRunning)

	// A config change that leaves the KubeletSpec alone does not restart it.
	_, err = f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) {
			c.MachineConfig.MachineKubelet.KubeletImage = img
			c.MachineConfig.MachineSysctls = map[string]string{"net.core.somaxconn": "1024"}
		}),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)
	select {
	case ev := <-events:
		t.Fatalf("unexpected %s of the kubelet service", ev.Type)
	case <-time.After(500 * time.Millisecond):
	}

	svcs, err := f.m.Services()
	require.NoError(t, err)
	var ids []string
	for _, s := range svcs {
		ids = append(ids, s.GetId())
		if s.GetId() == "kubelet" {
			assert.Equal(t, "Running", s.GetState())
			assert.True(t, s.GetHealth().GetHealthy())
			var states []string
			for _, e := range s.GetEvents().GetEvents() {
				states = append(states, e.GetState())
			}
			assert.Equal(t, []string{"Starting", "Waiting", "Preparing", "Preparing", "Running", "Stopping", "Finished",
				"Starting", "Waiting", "Preparing", "Preparing", "Running"}, states)
		}
	}
	assert.Equal(t, []string{"apid", "auditd", "containerd", "cri", "dashboard", "kubelet", "machined", "syslogd", "udevd"}, ids,
		"a worker runs neither etcd nor trustd")
}

// Talos lets the API restart and start the kubelet, and nothing else.
func TestServiceActions(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	events := watch(t, f.m.COSI(), v1alpha1res.NewService("kubelet").Metadata())
	require.Equal(t, state.Created, next(t, events, "initial").Type)

	require.NoError(t, f.m.ServiceAction(t.Context(), "kubelet", "restart"))
	for {
		ev := next(t, events, "restart")
		if ev.Type == state.Destroyed {
			break
		}
	}
	require.Equal(t, state.Created, next(t, events, "started again").Type)

	err := f.m.ServiceAction(t.Context(), "etcd", "restart")
	require.ErrorContains(t, err, `service "etcd" doesn't support restart operation via API`)
	err = f.m.ServiceAction(t.Context(), "kubelet", "stop")
	require.ErrorContains(t, err, `service "kubelet" doesn't support stop operation via API`)
	err = f.m.ServiceAction(t.Context(), "nope", "restart")
	require.ErrorContains(t, err, `service "nope" not defined`)
	require.NoError(t, f.m.ServiceAction(t.Context(), "kubelet", "start"), "already running: nothing to do")
}

// The MachineStatus follows Talos' stages: rebooting while the machine goes
// down (ready: Talos checks nothing in that stage), then after the boot
// running, ready only once the kubelet is healthy, the static pods ready
// and the Node Ready.
func TestMachineStatusAcrossAReboot(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	status := func() runtime.MachineStatusSpec {
		ms, err := safe.StateGetByID[*runtime.MachineStatus](t.Context(), f.m.COSI(), runtime.MachineStatusID)
		require.NoError(t, err)
		return *ms.TypedSpec()
	}
	require.Eventually(t, func() bool {
		s := status()
		return s.Stage == runtime.MachineStageRunning && len(s.Status.UnmetConditions) == 1
	}, 10*time.Second, 20*time.Millisecond, "only the node is waited for once the services are healthy")
	assert.Equal(t, []runtime.UnmetCondition{{Name: "nodeReady", Reason: `node "node-1" status is not available yet`}}, status().Status.UnmetConditions)
	assert.False(t, status().Status.Ready)

	notReady := map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": "False"}}}
	f.m.ObserveKubelet(simmachine.KubeletView{NodeReady: true, StaticPods: map[string]map[string]any{"kube-system/kube-apiserver-node-1": notReady}})
	require.Eventually(t, func() bool {
		_, err := safe.StateGetByID[*k8s.StaticPodStatus](t.Context(), f.m.COSI(), "kube-system/kube-apiserver-node-1")
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "the static pod status comes with the next refresh")
	assert.Equal(t, []runtime.UnmetCondition{{Name: "staticPods", Reason: "kube-system/kube-apiserver-node-1 not ready"}}, status().Status.UnmetConditions)

	ready := map[string]any{"phase": "Running", "conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
	f.m.ObserveKubelet(simmachine.KubeletView{NodeReady: true, StaticPods: map[string]map[string]any{"kube-system/kube-apiserver-node-1": ready}})
	require.Eventually(t, func() bool { return status().Status.Ready }, 10*time.Second, 20*time.Millisecond)

	events := watch(t, f.m.COSI(), runtime.NewMachineStatus().Metadata())
	require.Equal(t, state.Created, next(t, events, "initial").Type)
	kubelet := watch(t, f.m.COSI(), v1alpha1res.NewService("kubelet").Metadata())
	require.Equal(t, state.Created, next(t, kubelet, "initial").Type)
	before := f.m.State()
	require.NoError(t, f.m.Reboot())
	ev := next(t, events, "rebooting")
	require.Equal(t, state.Updated, ev.Type)
	ms := ev.Resource.(*runtime.MachineStatus).TypedSpec() //nolint:forcetypeassert
	assert.Equal(t, runtime.MachineStageRebooting, ms.Stage)
	assert.True(t, ms.Status.Ready, "no readiness check while rebooting")
	assert.Equal(t, state.Destroyed, next(t, kubelet, "kubelet stopped by the reboot").Type)

	after := waitState(t, f.m, "up again", func(s simmachine.State) bool { return s.Up && s.BootID != before.BootID })
	assert.True(t, after.KubeletRunning)
	// The stage moves on from booting once the boot's services run, as machined's does:
	// after the machine is up, not with it.
	require.Eventually(t, func() bool { return status().Stage == runtime.MachineStageRunning }, 10*time.Second, 20*time.Millisecond,
		"the new boot reaches the running stage")
	assert.False(t, status().Status.Ready, "a new boot knows nothing of the Node yet")
	_, err := safe.StateGetByID[*k8s.StaticPodStatus](t.Context(), f.m.COSI(), "kube-system/kube-apiserver-node-1")
	assert.True(t, state.IsNotFoundError(err), "nor of the static pods")
}

// Every boot starts from an empty state: the resources are rendered anew
// (versions from 1), the Version resource says the running Talos, and a
// watch on the previous boot's state sees nothing of the new one.
func TestEveryBootRendersItsResourcesAnew(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	version := func() string {
		v, err := safe.StateGetByID[*runtime.Version](ctx, f.m.COSI(), "version")
		require.NoError(t, err)
		assert.Equal(t, "Talos", v.TypedSpec().Name)
		return v.TypedSpec().Version
	}
	assert.Equal(t, "v1.12.4", version())
	_, err := f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.ClusterConfig.APIServerConfig.ContainerImage = newAPIServerImage }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)
	api, err := safe.StateGetByID[*k8s.APIServerConfig](ctx, f.m.COSI(), k8s.APIServerConfigID)
	require.NoError(t, err)
	assert.Equal(t, "2", api.Metadata().Version().String())

	stageInstall(t, f.m, "ghcr.io/siderolabs/installer:v1.13.9")
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	after := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	assert.Equal(t, "v1.13.9", version())
	api, err = safe.StateGetByID[*k8s.APIServerConfig](ctx, f.m.COSI(), k8s.APIServerConfigID)
	require.NoError(t, err)
	assert.Equal(t, "1", api.Metadata().Version().String(), "rendered anew")
	assert.Equal(t, newAPIServerImage, api.TypedSpec().Image, "from the config on disk")
	assert.Equal(t, "1", after.StaticPods[k8s.APIServerID].ConfigVersion)
	member, err := safe.StateGetByID[*etcd.Member](ctx, f.m.COSI(), etcd.LocalMemberID)
	require.NoError(t, err)
	assert.Len(t, member.TypedSpec().MemberID, 16)
}

// The machines of a cluster see each other as discovery members, named
// after their Kubernetes node, with the Talos each runs.
func TestDiscoveryMembers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := faults.Load(filepath.Join(dir, "faults.yaml"))
	require.NoError(t, err)
	disc := simmachine.NewDiscovery()
	newOne := func(name, ip string, typ machine.Type) *simmachine.Machine {
		m, err := simmachine.New(simmachine.Options{
			Name: name, IP: netip.MustParseAddr(ip), ControlPlane: typ == machine.TypeControlPlane,
			TalosVersion: "v1.13.9", Config: bytesOf(t, genConfig(t, typ)), Faults: store, Discovery: disc,
			RebootDelay: 100 * time.Millisecond, PullLatency: 10 * time.Millisecond, HealthCheckDelay: 50 * time.Millisecond,
		})
		require.NoError(t, err)
		t.Cleanup(m.Close)
		return m
	}
	cp := newOne("cp-1", "127.0.0.21", machine.TypeControlPlane)
	w := newOne("w-1", "127.0.0.22", machine.TypeWorker)

	members := func(m *simmachine.Machine) map[string]cluster.MemberSpec {
		list, err := safe.StateListAll[*cluster.Member](t.Context(), m.COSI())
		require.NoError(t, err)
		out := map[string]cluster.MemberSpec{}
		for r := range list.All() {
			out[r.Metadata().ID()] = *r.TypedSpec()
		}
		return out
	}
	for _, m := range []*simmachine.Machine{cp, w} {
		got := members(m)
		require.Len(t, got, 2, m.Name())
		assert.Equal(t, "Talos (v1.13.9)", got["w-1"].OperatingSystem)
		assert.Equal(t, machine.TypeControlPlane, got["cp-1"].MachineType)
		assert.Equal(t, []netip.Addr{netip.MustParseAddr("127.0.0.22")}, got["w-1"].Addresses)
		assert.NotNil(t, got["cp-1"].ControlPlane)
		assert.Nil(t, got["w-1"].ControlPlane)
	}
	id, err := safe.StateGetByID[*cluster.Identity](t.Context(), w.COSI(), cluster.LocalIdentity)
	require.NoError(t, err)
	assert.Equal(t, id.TypedSpec().NodeID, members(cp)["w-1"].NodeID)

	stageInstall(t, w, installer1141)
	require.NoError(t, w.Reboot())
	require.Eventually(t, func() bool {
		return members(cp)["w-1"].OperatingSystem == "Talos (v1.14.1)"
	}, 10*time.Second, 20*time.Millisecond, "the control plane sees the worker's new Talos")
	id2, err := safe.StateGetByID[*cluster.Identity](t.Context(), w.COSI(), cluster.LocalIdentity)
	require.NoError(t, err)
	assert.Equal(t, id.TypedSpec().NodeID, id2.TypedSpec().NodeID, "the identity survives reboots")
}

// installer1141 is Talos 1.14.1's default installer (no generic one exists).
const installer1141 = "factory.talos.dev/metal-installer/" + emptySchematic + ":v1.14.1"

// stageInstall stages an installer's Talos on a machine (for the next reboot).
func stageInstall(t *testing.T, m *simmachine.Machine, image string) {
	t.Helper()
	ctx := context.WithoutCancel(t.Context())
	_, err := m.Pull(ctx, simmachine.NamespaceSystem, image)
	require.NoError(t, err)
	require.NoError(t, m.StageUpgrade(ctx, simmachine.NamespaceSystem, image, nil))
}

// Talos 1.14 renders the static pods from the "final-" control plane config
// resources and annotates them with those resources' versions; Talos 1.13
// has none.
func TestFinalControlPlaneConfigsFromTalos114(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	_, err := safe.StateGetByID[*k8s.APIServerConfig](ctx, f.m.COSI(), k8s.FinalAPIServerConfigID)
	assert.True(t, state.IsNotFoundError(err), "Talos 1.12 has no final config")

	stageInstall(t, f.m, installer1141)
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	_, err = f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) {
			c.ClusterConfig.SchedulerConfig.ContainerImage = "registry.k8s.io/kube-scheduler:v1.36.3"
		}),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)
	for id, final := range map[string]string{
		k8s.APIServerID: k8s.FinalAPIServerConfigID, k8s.ControllerManagerID: k8s.FinalControllerManagerConfigID, k8s.SchedulerID: k8s.FinalSchedulerConfigID,
	} {
		var typ resource.Type
		switch id {
		case k8s.APIServerID:
			typ = k8s.APIServerConfigType
		case k8s.ControllerManagerID:
			typ = k8s.ControllerManagerConfigType
		default:
			typ = k8s.SchedulerConfigType
		}
		r, err := f.m.COSI().Get(ctx, resource.NewMetadata(k8s.ControlPlaneNamespaceName, typ, final, resource.VersionUndefined))
		require.NoError(t, err, final)
		assert.Equal(t, r.Metadata().Version().String(), f.m.State().StaticPods[id].ConfigVersion, id)
		sp, err := safe.StateGetByID[*k8s.StaticPod](ctx, f.m.COSI(), id)
		require.NoError(t, err)
		assert.Equal(t, r.Metadata().Version().String(), sp.TypedSpec().Pod["metadata"].(map[string]any)["annotations"].(map[string]any)["talos.dev/config-version"])
	}
	assert.Equal(t, "registry.k8s.io/kube-scheduler:v1.36.3", f.m.State().StaticPods[k8s.SchedulerID].Image)
}
