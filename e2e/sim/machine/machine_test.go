package machine_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	machineapi "github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate"
	"github.com/siderolabs/talos/pkg/machinery/config/machine"
	"github.com/siderolabs/talos/pkg/machinery/config/types/v1alpha1"
	configres "github.com/siderolabs/talos/pkg/machinery/resources/config"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	v1alpha1res "github.com/siderolabs/talos/pkg/machinery/resources/v1alpha1"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/events"
	"github.com/ichor-dev/kubectl-ichor/e2e/sim/faults"
	simmachine "github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

const newAPIServerImage = "registry.k8s.io/kube-apiserver:v1.36.3"

func genConfig(t *testing.T, typ machine.Type) config.Provider {
	t.Helper()
	in, err := generate.NewInput("sim", "https://127.0.0.1:6443", "1.35.2",
		generate.WithVersionContract(config.TalosVersion1_13))
	require.NoError(t, err)
	cfg, err := in.Config(typ)
	require.NoError(t, err)
	return cfg
}

func bytesOf(t *testing.T, cfg config.Provider) []byte {
	t.Helper()
	b, err := cfg.Bytes()
	require.NoError(t, err)
	return b
}

func patch(t *testing.T, cfg config.Provider, fn func(*v1alpha1.Config)) []byte {
	t.Helper()
	out, err := cfg.PatchV1Alpha1(func(c *v1alpha1.Config) error { fn(c); return nil })
	require.NoError(t, err)
	return bytesOf(t, out)
}

type fixture struct {
	cfg     config.Provider
	m       *simmachine.Machine
	events  string
	faults  string
	drained chan struct{}
}

func newMachine(t *testing.T, controlPlane bool, faultsYAML string) *fixture {
	t.Helper()
	return newMachineAt(t, controlPlane, faultsYAML, "v1.12.4")
}

// newMachineAt is newMachine first booting Talos version.
func newMachineAt(t *testing.T, controlPlane bool, faultsYAML, version string) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{events: filepath.Join(dir, "events.jsonl"), faults: filepath.Join(dir, "faults.yaml"), drained: make(chan struct{}, 1)}
	typ := machine.TypeWorker
	if controlPlane {
		typ = machine.TypeControlPlane
	}
	f.cfg = genConfig(t, typ)
	if faultsYAML != "" {
		require.NoError(t, os.WriteFile(f.faults, []byte(faultsYAML), 0o644))
	}
	store, err := faults.Load(f.faults)
	require.NoError(t, err)
	log, err := events.Open(f.events)
	require.NoError(t, err)
	t.Cleanup(func() { _ = log.Close() })
	m, err := simmachine.New(simmachine.Options{
		Name:         "node-1",
		IP:           netip.MustParseAddr("127.0.0.10"),
		ControlPlane: controlPlane,
		TalosVersion: version,
		Config:       bytesOf(t, f.cfg),
		Events:       log,
		Faults:       store,
		RebootDelay:  100 * time.Millisecond,
		PullLatency:  10 * time.Millisecond,
		// Health checks and the static pod status refresh come sooner than
		// on Talos (1-5s, 15s), in the same order.
		HealthCheckDelay:        100 * time.Millisecond,
		StaticPodStatusInterval: 200 * time.Millisecond,
		BeforeReboot: func(context.Context) error {
			f.drained <- struct{}{}
			return nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(m.Close)
	f.m = m
	return f
}

func waitState(t *testing.T, m *simmachine.Machine, what string, cond func(simmachine.State) bool) simmachine.State {
	t.Helper()
	ch, cancel := m.Subscribe()
	defer cancel()
	deadline := time.After(10 * time.Second)
	for {
		if s := m.State(); cond(s) {
			return s
		}
		select {
		case <-ch:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatalf("timed out waiting for %s; state %+v", what, m.State())
		}
	}
}

func talosEvents(t *testing.T, path string) []string {
	t.Helper()
	evs, err := events.Read(path)
	require.NoError(t, err)
	var out []string
	for _, e := range evs {
		if e.Component == events.Talos {
			out = append(out, e.Version)
		}
	}
	return out
}

// talosStarts counts the Talos starts in the events file, -1 while it cannot be read
// (for polling from require.Eventually, which must not fail the test itself).
func talosStarts(path string) int {
	evs, err := events.Read(path)
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range evs {
		if e.Component == events.Talos {
			n++
		}
	}
	return n
}

func TestNewControlPlane(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	s := f.m.State()
	assert.True(t, s.Up)
	assert.Equal(t, "v1.12.4", s.TalosVersion)
	assert.Equal(t, 1, s.ConfigVersion)
	assert.Len(t, s.StaticPods, 3)
	assert.Equal(t, f.cfg.K8sAPIServerConfig().Image(), s.StaticPods[k8s.APIServerID].Image)
	assert.Equal(t, f.cfg.K8sKubeletConfig().Image(), s.KubeletImage)
	assert.Equal(t, f.cfg.K8sProxyConfig().Image(), s.ProxyImage)
	assert.Equal(t, []string{"v1.12.4"}, talosEvents(t, f.events))

	st := f.m.COSI()
	mc, err := safe.StateGetByID[*configres.MachineConfig](ctx, st, configres.ActiveID)
	require.NoError(t, err)
	assert.Equal(t, f.cfg.K8sAPIServerConfig().Image(), mc.Config().K8sAPIServerConfig().Image())
	_, err = safe.StateGetByID[*configres.MachineConfig](ctx, st, configres.PersistentID)
	require.NoError(t, err)
	svc, err := safe.StateGetByID[*v1alpha1res.Service](ctx, st, "kubelet")
	require.NoError(t, err)
	assert.True(t, svc.TypedSpec().Running, "the kubelet runs")
	nn, err := safe.StateGetByID[*k8s.Nodename](ctx, st, k8s.NodenameID)
	require.NoError(t, err)
	assert.Equal(t, "node-1", nn.TypedSpec().Nodename)

	manifests, err := safe.StateListAll[*k8s.Manifest](ctx, st)
	require.NoError(t, err)
	var kinds []string
	for r := range manifests.All() {
		for _, item := range r.TypedSpec().Items {
			kinds = append(kinds, item.Object["kind"].(string)+"/"+item.Object["metadata"].(map[string]any)["name"].(string))
			if item.Object["kind"] == "DaemonSet" {
				spec := item.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
				c := spec["containers"].([]any)[0].(map[string]any)
				assert.Equal(t, s.ProxyImage, c["image"])
			}
			if item.Object["kind"] == "Service" {
				assert.Equal(t, "10.96.0.10", item.Object["spec"].(map[string]any)["clusterIP"])
			}
		}
	}
	assert.Subset(t, kinds, []string{"ServiceAccount/kube-proxy", "ClusterRoleBinding/kube-proxy", "DaemonSet/kube-proxy",
		"Deployment/coredns", "ConfigMap/coredns", "Service/kube-dns"})
	ms, err := safe.StateGetByID[*k8s.ManifestStatus](ctx, st, k8s.ManifestStatusID)
	require.NoError(t, err)
	assert.Contains(t, ms.TypedSpec().ManifestsApplied, "10-kube-proxy")

	sp, err := safe.StateGetByID[*k8s.StaticPod](ctx, st, k8s.APIServerID)
	require.NoError(t, err)
	ann := sp.TypedSpec().Pod["metadata"].(map[string]any)["annotations"].(map[string]any)
	assert.Equal(t, s.StaticPods[k8s.APIServerID].ConfigVersion, ann["talos.dev/config-version"])
}

func TestWorkerHasNoControlPlaneResources(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	assert.Empty(t, f.m.State().StaticPods)
	_, err := safe.StateGetByID[*k8s.APIServerConfig](t.Context(), f.m.COSI(), k8s.APIServerConfigID)
	assert.Error(t, err)
	_, err = f.m.Kubeconfig()
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
}

func TestApplyNoRebootImageChange(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	before := f.m.State()
	ch, cancel := f.m.Subscribe()
	defer cancel()

	resp, err := f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.ClusterConfig.APIServerConfig.ContainerImage = newAPIServerImage }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)
	assert.Equal(t, machineapi.ApplyConfigurationRequest_NO_REBOOT, resp.GetMode())
	assert.Equal(t, "Applied configuration without a reboot", resp.GetModeDetails())
	select {
	case <-ch:
	case <-time.After(time.Second):
		t.Fatal("no notification after apply")
	}

	after := f.m.State()
	assert.Equal(t, before.BootID, after.BootID, "no reboot")
	assert.Equal(t, before.ConfigVersion+1, after.ConfigVersion)
	assert.Equal(t, newAPIServerImage, after.StaticPods[k8s.APIServerID].Image)
	assert.NotEqual(t, before.StaticPods[k8s.APIServerID].ConfigVersion, after.StaticPods[k8s.APIServerID].ConfigVersion)
	assert.Equal(t, before.StaticPods[k8s.SchedulerID], after.StaticPods[k8s.SchedulerID], "scheduler untouched")

	api, err := safe.StateGetByID[*k8s.APIServerConfig](ctx, f.m.COSI(), k8s.APIServerConfigID)
	require.NoError(t, err)
	assert.Equal(t, newAPIServerImage, api.TypedSpec().Image)
	assert.Equal(t, api.Metadata().Version().String(), after.StaticPods[k8s.APIServerID].ConfigVersion)
	mc, err := safe.StateGetByID[*configres.MachineConfig](ctx, f.m.COSI(), configres.ActiveID)
	require.NoError(t, err)
	assert.Equal(t, newAPIServerImage, mc.Config().K8sAPIServerConfig().Image())
}

func TestApplyKubeletImageRestartsKubelet(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	const img = "ghcr.io/siderolabs/kubelet:v1.36.3"
	_, err := f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.MachineConfig.MachineKubelet.KubeletImage = img }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)
	assert.Equal(t, img, f.m.State().KubeletImage)
	spec, err := safe.StateGetByID[*k8s.KubeletSpec](t.Context(), f.m.COSI(), k8s.KubeletID)
	require.NoError(t, err)
	assert.Equal(t, img, spec.TypedSpec().Image)
	require.Eventually(t, func() bool {
		svc, err := safe.StateGetByID[*v1alpha1res.Service](t.Context(), f.m.COSI(), "kubelet")
		return err == nil && svc.TypedSpec().Running && svc.TypedSpec().Healthy
	}, 5*time.Second, 20*time.Millisecond)
}

func TestApplyNoRebootRefusesRebootChange(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	before := f.m.State()
	data := patch(t, f.cfg, func(c *v1alpha1.Config) { c.MachineConfig.MachineEnv = map[string]string{"FOO": "bar"} })

	_, err := f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: data,
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.Error(t, err)
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, err.Error(), "can't be applied")
	assert.Contains(t, err.Error(), "FOO")
	after := f.m.State()
	assert.Equal(t, before.ConfigVersion, after.ConfigVersion)

	// AUTO picks a reboot for the same change (dry run: nothing happens).
	resp, err := f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: data, Mode: machineapi.ApplyConfigurationRequest_AUTO, DryRun: true,
	})
	require.NoError(t, err)
	assert.Equal(t, machineapi.ApplyConfigurationRequest_REBOOT, resp.GetMode())
}

func TestApplyDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	before := f.m.State()
	apiBefore, err := safe.StateGetByID[*k8s.APIServerConfig](ctx, f.m.COSI(), k8s.APIServerConfigID)
	require.NoError(t, err)

	resp, err := f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data:   patch(t, f.cfg, func(c *v1alpha1.Config) { c.ClusterConfig.APIServerConfig.ContainerImage = newAPIServerImage }),
		Mode:   machineapi.ApplyConfigurationRequest_NO_REBOOT,
		DryRun: true,
	})
	require.NoError(t, err)
	assert.Contains(t, resp.GetModeDetails(), "Dry run summary")
	assert.Regexp(t, `(?m)^\+\s+image: `+regexp.QuoteMeta(newAPIServerImage)+`$`, resp.GetModeDetails())
	assert.NotContains(t, resp.GetModeDetails(), f.cfg.RawV1Alpha1().ClusterConfig.ClusterSecret) //nolint:staticcheck // the generated secret

	after := f.m.State()
	assert.Equal(t, before.ConfigVersion, after.ConfigVersion)
	assert.Equal(t, before.StaticPods, after.StaticPods)
	apiAfter, err := safe.StateGetByID[*k8s.APIServerConfig](ctx, f.m.COSI(), k8s.APIServerConfigID)
	require.NoError(t, err)
	assert.Equal(t, apiBefore.Metadata().Version(), apiAfter.Metadata().Version())
}

func TestApplyBlocksHonoursDeadline(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "nodes:\n  node-1:\n    applyBlocks: true\n")
	before := f.m.State()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.ClusterConfig.APIServerConfig.ContainerImage = newAPIServerImage }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	elapsed := time.Since(start)
	require.Error(t, err)
	assert.Equal(t, codes.DeadlineExceeded, status.Code(err))
	assert.GreaterOrEqual(t, elapsed, 250*time.Millisecond)
	assert.Less(t, elapsed, 3*time.Second)
	assert.Equal(t, before.ConfigVersion, f.m.State().ConfigVersion)
	assert.Equal(t, before.StaticPods, f.m.State().StaticPods)

	// A dry run is not blocked.
	_, err = f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: bytesOf(t, f.cfg), Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT, DryRun: true,
	})
	require.NoError(t, err)
}

func TestUpgradeThenRebootBootsNewVersion(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	before := f.m.State()

	var msgs []string
	const image = "factory.talos.dev/installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1.13.9"
	_, err := f.m.Pull(ctx, simmachine.NamespaceSystem, image)
	require.NoError(t, err)
	err = f.m.StageUpgrade(ctx, simmachine.NamespaceSystem, image,
		func(msg string) error { msgs = append(msgs, msg); return nil })
	require.NoError(t, err)
	assert.NotEmpty(t, msgs)
	staged := f.m.State()
	assert.Equal(t, "v1.13.9", staged.StagedVersion)
	v, err := f.m.Version()
	require.NoError(t, err)
	assert.Equal(t, "v1.12.4", v, "new version only after a reboot")

	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	_, err = f.m.Version()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.False(t, f.m.Reachable())
	after := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })

	assert.Equal(t, "v1.13.9", after.TalosVersion)
	assert.NotEqual(t, before.BootID, after.BootID)
	assert.Empty(t, after.StagedVersion)
	assert.Equal(t, before.ConfigVersion, after.ConfigVersion)
	// The boot's event is logged as the machine comes up, not before its state says so.
	assert.Eventually(t, func() bool { return slices.Equal([]string{"v1.12.4", "v1.13.9"}, talosEvents(t, f.events)) },
		5*time.Second, 10*time.Millisecond, "a boot event per version: %v", talosEvents(t, f.events))
	select {
	case <-f.drained:
		t.Fatal("a plain reboot does not drain")
	default:
	}
}

func TestABFallbackBootsOldVersion(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "nodes:\n  node-1:\n    abFallback: true\n")
	before := f.m.State()
	stageInstall(t, f.m, "ghcr.io/siderolabs/installer:v1.13.9")
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	after := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	assert.Equal(t, "v1.12.4", after.TalosVersion)
	assert.NotEqual(t, before.BootID, after.BootID)
	assert.Empty(t, after.StagedVersion)
	// The boot's event is logged as the machine comes up, not before its state says so.
	assert.Eventually(t, func() bool { return slices.Equal([]string{"v1.12.4", "v1.12.4"}, talosEvents(t, f.events)) },
		5*time.Second, 10*time.Millisecond, "a boot event per boot, both on the old version: %v", talosEvents(t, f.events))
}

func TestNeverBootsUntilCleared(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "nodes:\n  node-1:\n    neverBoots: true\n")
	stageInstall(t, f.m, "ghcr.io/siderolabs/installer:v1.13.9")
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	time.Sleep(500 * time.Millisecond)
	assert.False(t, f.m.State().Up)
	require.NoError(t, os.WriteFile(f.faults, []byte("nodes: {}\n"), 0o644))
	after := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	assert.Equal(t, "v1.13.9", after.TalosVersion)
}

func TestPull(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	name, err := f.m.Pull(t.Context(), simmachine.NamespaceCRI, "registry.k8s.io/kube-proxy:v1.36.3")
	require.NoError(t, err)
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.36.3", name)
	assert.Equal(t, []string{"registry.k8s.io/kube-proxy:v1.36.3"}, f.m.Images(simmachine.NamespaceCRI))
	assert.Empty(t, f.m.Images(simmachine.NamespaceSystem), "each namespace its own")

	g := newMachine(t, false, "nodes:\n  node-1:\n    pullFails: true\n")
	_, err = g.m.Pull(t.Context(), simmachine.NamespaceCRI, "registry.k8s.io/kube-proxy:v1.36.3")
	require.Error(t, err)
	assert.Equal(t, codes.NotFound, status.Code(err))
	assert.True(t, strings.Contains(err.Error(), "failed to pull image") && strings.Contains(err.Error(), "not found"), err.Error())
}

func TestStagedApplyTakesEffectAfterReboot(t *testing.T) {
	t.Parallel()
	f := newMachine(t, false, "")
	data := patch(t, f.cfg, func(c *v1alpha1.Config) { c.MachineConfig.MachineEnv = map[string]string{"FOO": "bar"} })
	resp, err := f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{Data: data, Mode: machineapi.ApplyConfigurationRequest_STAGED})
	require.NoError(t, err)
	assert.Equal(t, machineapi.ApplyConfigurationRequest_STAGED, resp.GetMode())
	assert.True(t, f.m.State().ConfigStaged)
	assert.Equal(t, 1, f.m.State().ConfigVersion)
	require.NoError(t, f.m.Reboot())
	waitState(t, f.m, "down", func(s simmachine.State) bool { return !s.Up })
	after := waitState(t, f.m, "up", func(s simmachine.State) bool { return s.Up })
	assert.Equal(t, 2, after.ConfigVersion)
	assert.Equal(t, "bar", after.Config.RawV1Alpha1().MachineConfig.MachineEnv["FOO"])
}

// proxyImageInManifests is the kube-proxy DaemonSet's image in the 10-kube-proxy
// Manifest resource, "" when there is none.
func proxyImageInManifests(t *testing.T, m *simmachine.Machine) string {
	t.Helper()

	r, err := safe.StateGetByID[*k8s.Manifest](t.Context(), m.COSI(), "10-kube-proxy")
	require.NoError(t, err)

	for _, item := range r.TypedSpec().Items {
		if item.Object["kind"] != "DaemonSet" {
			continue
		}

		spec, _ := item.Object["spec"].(map[string]any)
		tmpl, _ := spec["template"].(map[string]any)
		pod, _ := tmpl["spec"].(map[string]any)
		containers, _ := pod["containers"].([]any)

		for _, c := range containers {
			if cm, _ := c.(map[string]any); cm["name"] == "kube-proxy" {
				image, _ := cm["image"].(string)

				return image
			}
		}
	}

	return ""
}

// Talos re-renders the bootstrap manifests asynchronously after a config change: an
// apply returns with the old ones, the new ones follow a few seconds later.
func TestManifestsRerenderAfterTheApply(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	ctx := t.Context()
	before := proxyImageInManifests(t, f.m)
	require.NotEmpty(t, before)

	const newProxy = "registry.k8s.io/kube-proxy:v1.99.0"

	_, err := f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.ClusterConfig.ProxyConfig.ContainerImage = newProxy }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)
	assert.Equal(t, before, proxyImageInManifests(t, f.m), "not re-rendered at once")

	deadline := time.Now().Add(30 * time.Second)
	for proxyImageInManifests(t, f.m) != newProxy {
		require.True(t, time.Now().Before(deadline), "manifests not re-rendered for %s in 30s", newProxy)
		time.Sleep(100 * time.Millisecond)
	}
}

// manifestKinds are the objects of a Manifest resource as "Kind namespace/name", nil
// when there is no such resource.
func manifestKinds(t *testing.T, m *simmachine.Machine, id string) []string {
	t.Helper()

	r, err := safe.StateGetByID[*k8s.Manifest](t.Context(), m.COSI(), id)
	if state.IsNotFoundError(err) {
		return nil
	}

	require.NoError(t, err)

	var out []string

	for _, item := range r.TypedSpec().Items {
		u := unstructured.Unstructured{Object: item.Object}
		out = append(out, u.GetKind()+" "+u.GetNamespace()+"/"+u.GetName())
	}

	return out
}

// A control plane renders the user's inline and extra manifests as Talos does: Manifest
// "99-<name>" each (an extra manifest named by its URL), after the default ones, a List
// unwrapped and comment-only documents dropped; a manifest taken out of the config goes.
func TestManifestsRenderInlineAndExtraManifests(t *testing.T) {
	t.Parallel()

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Token") != "secret" {
			http.Error(w, "no token", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a, namespace: extra}\n- apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: b, namespace: extra}\n")
	}))
	t.Cleanup(srv.Close)

	f := newMachine(t, true, "")
	ctx := t.Context()
	url := srv.URL + "/extra.yaml"

	_, err := f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) {
			c.ClusterConfig.ClusterInlineManifests = v1alpha1.ClusterInlineManifests{{
				InlineManifestName:     "cni",
				InlineManifestContents: "# a comment only\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: cni\n---\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: cni\n  namespace: cni\n",
			}}
			c.ClusterConfig.ExtraManifests = []string{url}
			c.ClusterConfig.ExtraManifestHeaders = map[string]string{"X-Token": "secret"}
		}),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)

	deadline := time.Now().Add(30 * time.Second)
	for manifestKinds(t, f.m, "99-cni") == nil {
		require.True(t, time.Now().Before(deadline), "inline manifest not rendered in 30s")
		time.Sleep(100 * time.Millisecond)
	}

	assert.Equal(t, []string{"Namespace /cni", "DaemonSet cni/cni"}, manifestKinds(t, f.m, "99-cni"))
	assert.Equal(t, []string{"ConfigMap extra/a", "ConfigMap extra/b"}, manifestKinds(t, f.m, "99-"+url))

	ms, err := safe.StateGetByID[*k8s.ManifestStatus](ctx, f.m.COSI(), k8s.ManifestStatusID)
	require.NoError(t, err)
	applied := ms.TypedSpec().ManifestsApplied
	assert.Equal(t, []string{"99-cni", "99-" + url}, applied[len(applied)-2:], "the user's manifests come last")

	_, err = f.m.ApplyConfiguration(ctx, &machineapi.ApplyConfigurationRequest{
		Data: bytesOf(t, f.cfg),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)

	for manifestKinds(t, f.m, "99-cni") != nil {
		require.True(t, time.Now().Before(deadline.Add(30*time.Second)), "inline manifest not removed")
		time.Sleep(100 * time.Millisecond)
	}

	assert.Nil(t, manifestKinds(t, f.m, "99-"+url))
}

// TestPoweredOffJoinsWhenSwitchedOn: a control plane powered off from the start
// has not booted (no boot ID, no Talos start, unreachable) and is no etcd member;
// cleared, it boots from its own config, static pods at its config's images, and
// joins etcd. Set again, it loses power but stays a member; cleared, it boots anew.
func TestPoweredOffJoinsWhenSwitchedOn(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "nodes:\n  node-1:\n    poweredOff: true\n")

	off := f.m.State()
	assert.False(t, off.Up)
	assert.Empty(t, off.BootID)
	assert.Empty(t, off.StaticPods)
	assert.False(t, f.m.Reachable())
	assert.False(t, f.m.EtcdMember())
	_, err := f.m.Version()
	assert.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	assert.Empty(t, talosEvents(t, f.events))

	require.NoError(t, os.WriteFile(f.faults, []byte("nodes: {}\n"), 0o644))
	on := waitState(t, f.m, "booted", func(s simmachine.State) bool { return s.Up })
	assert.NotEmpty(t, on.BootID)
	assert.True(t, f.m.Reachable())
	assert.True(t, f.m.EtcdMember())
	assert.Equal(t, f.cfg.K8sAPIServerConfig().Image(), on.StaticPods["kube-apiserver"].Image, "its own config's apiserver")
	assert.Equal(t, f.cfg.K8sKubeletConfig().Image(), on.KubeletImage)
	// The boot's Talos start is recorded by the boot, a moment after the machine is up.
	require.Eventually(t, func() bool { return talosStarts(f.events) == 1 }, 10*time.Second, 20*time.Millisecond, "one Talos start")
	assert.Equal(t, []string{"v1.12.4"}, talosEvents(t, f.events))

	require.NoError(t, os.WriteFile(f.faults, []byte("nodes:\n  node-1:\n    poweredOff: true\n"), 0o644))
	waitState(t, f.m, "power lost", func(s simmachine.State) bool { return !s.Up })
	assert.False(t, f.m.Reachable())
	assert.True(t, f.m.EtcdMember(), "a member stays listed while down")

	require.NoError(t, os.WriteFile(f.faults, []byte("nodes: {}\n"), 0o644))
	again := waitState(t, f.m, "booted again", func(s simmachine.State) bool { return s.Up })
	assert.NotEqual(t, on.BootID, again.BootID)
	require.Eventually(t, func() bool { return talosStarts(f.events) == 2 }, 10*time.Second, 20*time.Millisecond, "a second Talos start")
	assert.Equal(t, []string{"v1.12.4", "v1.12.4"}, talosEvents(t, f.events))
}

// TestWorkerIsNoEtcdMember: only control planes join etcd.
func TestWorkerIsNoEtcdMember(t *testing.T) {
	t.Parallel()
	assert.False(t, newMachine(t, false, "").m.EtcdMember())
	assert.True(t, newMachine(t, true, "").m.EtcdMember())
}

// kubeProxyServer is the apiserver in the kubeconfig-in-cluster ConfigMap.
func kubeProxyServer(t *testing.T, m *simmachine.Machine) string {
	t.Helper()

	r, err := safe.StateGetByID[*k8s.Manifest](t.Context(), m.COSI(), "11-kube-config-in-cluster")
	require.NoError(t, err)
	require.Len(t, r.TypedSpec().Items, 1)

	kubeconfig, _, _ := unstructured.NestedString(r.TypedSpec().Items[0].Object, "data", "kubeconfig")
	for line := range strings.Lines(kubeconfig) {
		if server, ok := strings.CutPrefix(strings.TrimSpace(line), "server: "); ok {
			return server
		}
	}

	t.Fatalf("no server in kubeconfig-in-cluster:\n%s", kubeconfig)

	return ""
}

// kube-proxy reaches the apiserver as Talos' BootstrapManifestsConfig says:
// through KubePrism on its own node when KubePrism is enabled (the default),
// through the cluster endpoint otherwise.
func TestKubeconfigInClusterServer(t *testing.T) {
	t.Parallel()
	f := newMachine(t, true, "")
	assert.Equal(t, "https://127.0.0.1:7445", kubeProxyServer(t, f.m))

	_, err := f.m.ApplyConfiguration(t.Context(), &machineapi.ApplyConfigurationRequest{
		Data: patch(t, f.cfg, func(c *v1alpha1.Config) { c.MachineConfig.MachineFeatures.KubePrismSupport = nil }),
		Mode: machineapi.ApplyConfigurationRequest_NO_REBOOT,
	})
	require.NoError(t, err)

	deadline := time.Now().Add(30 * time.Second)
	for kubeProxyServer(t, f.m) != "https://127.0.0.1:6443" {
		require.True(t, time.Now().Before(deadline), "kubeconfig-in-cluster not re-rendered with the cluster endpoint in 30s")
		time.Sleep(100 * time.Millisecond)
	}
}

// Like machined, a machine does not boot with a config that does not
// validate: here a hostname set both in the HostnameConfig document and in
// machine.network, which ApplyConfiguration refuses too.
func TestNewRefusesAnInvalidConfig(t *testing.T) {
	t.Parallel()
	cfg := genConfig(t, machine.TypeWorker)
	require.True(t, cfg.Has("HostnameConfig"), "the generated config keeps the hostname in a document")
	_, err := simmachine.New(simmachine.Options{
		Name:         "node-1",
		IP:           netip.MustParseAddr("127.0.0.10"),
		TalosVersion: "v1.13.9",
		Config: patch(t, cfg, func(c *v1alpha1.Config) {
			c.MachineConfig.MachineNetwork = &v1alpha1.NetworkConfig{NetworkHostname: "node-1"} //nolint:staticcheck // the conflict under test
		}),
	})
	require.ErrorContains(t, err, "static hostname is already set")
}

// A reboot power-cycles the machine while it is down: the hook runs once,
// with the machine down, and the machine boots only after it returns.
func TestRebootPowerCyclesWhileDown(t *testing.T) {
	t.Parallel()
	var m *simmachine.Machine
	var calls atomic.Int32
	var upDuring atomic.Bool
	release := make(chan struct{})
	m, err := simmachine.New(simmachine.Options{
		Name:         "node-1",
		IP:           netip.MustParseAddr("127.0.0.10"),
		TalosVersion: "v1.13.9",
		Config:       bytesOf(t, genConfig(t, machine.TypeWorker)),
		RebootDelay:  50 * time.Millisecond,
		PowerCycle: func(ctx context.Context) error {
			calls.Add(1)
			upDuring.Store(m.State().Up)
			<-release
			return nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(m.Close)
	before := m.State().BootID

	require.NoError(t, m.Reboot())
	require.Eventually(t, func() bool { return calls.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	assert.False(t, m.State().Up, "booted before the power cycle returned")
	close(release)
	after := waitState(t, m, "up", func(s simmachine.State) bool { return s.Up })
	assert.NotEqual(t, before, after.BootID)
	assert.False(t, upDuring.Load(), "power-cycled while up")
	assert.EqualValues(t, 1, calls.Load())
}
