//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"

	simmanifests "github.com/ichor-dev/kubectl-ichor/e2e/sim/manifests"
)

// TestJobBornOnTalos112 upgrades, through the Job, a cluster born on Talos v1.12.4: its
// bootstrap objects were created by a plain Create under field manager "talos"
// (operation Update), which a server-side apply under "talos" meets as another manager.
// Talos is upgraded to v1.13.9 (the objects kept, Talos' inventory backfilled), then
// Kubernetes one minor: plan says the sync takes the kube-proxy DaemonSet over from
// Talos' own Create; the run does, kube-proxy and every bootstrap object reach the
// target, and an object Helm changed (a field owned by manager "helm") is kept. The
// inventory holds every object the sync synced, and talosctl upgrade-k8s' own sync
// afterwards prunes nothing.
func TestJobBornOnTalos112(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, "--workers", "1", "--talos", "v1.12.4")
	ctx := context.Background()
	tc := openTalos(t, c)

	require.Equal(t, "v1.12.4", c.Info.BornOn)

	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"talos/Update"}, managerOps(ds.ManagedFields), "created as Talos 1.12 does")

	_, err = c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, simmanifests.InventoryName, metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "Talos 1.12 keeps no inventory: %v", err)

	// Helm changes an object Talos created.
	const mark = "# changed by helm"

	cms := c.Client.CoreV1().ConfigMaps("kube-system")
	cm, err := cms.Get(ctx, "coredns", metav1.GetOptions{})
	require.NoError(t, err)

	cm.Data["Corefile"] += "\n" + mark + "\n"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "helm"})
	require.NoError(t, err)

	// Talos first.
	r := c.ichor(t, 20*time.Minute, "upgrade", "talos", "--to", "v1.13.9", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	eventually(t, time.Minute, "Talos 1.13's inventory", func(ctx context.Context) error {
		inv, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, simmanifests.InventoryName, metav1.GetOptions{})
		if err != nil {
			return err
		}

		if _, ok := inv.Data["kube-system_kube-proxy_apps_DaemonSet"]; !ok {
			return fmt.Errorf("kube-proxy not backfilled: %v", inv.Data)
		}

		return nil
	})

	ds, err = c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(t, err)
	require.Equal(t, []string{"talos/Update"}, managerOps(ds.ManagedFields), "kept through the Talos upgrade")

	// Then Kubernetes one minor.
	before := machineConfigs(t, c, tc)

	r = c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)
	check := tableChecks(r.stdout)["bootstrap manifests"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "the sync skips them: ConfigMap kube-system/coredns")
	require.Contains(t, check.detail, `held by Talos' own earlier writes, taken over: DaemonSet kube-system/kube-proxy (from "talos" (Update))`)

	r = c.ichor(t, 15*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--verify-timeout", "4m")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.Contains(t, r.stdout, "skipped 1 changed by another field manager: ConfigMap kube-system/coredns")
	assert.Equal(t, api.PhaseSucceeded, c.operation(t).Status.Phase)

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))

	ds, err = c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(t, err)
	assert.True(t, ownsFieldAs(ds.ManagedFields, "talos", metav1.ManagedFieldsOperationApply, "f:image"), "taken over by the sync's apply")

	cm, err = cms.Get(ctx, "coredns", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, cm.Data["Corefile"], mark, "Helm's change is kept")
	assert.True(t, ownsField(cm.ManagedFields, "helm", "f:Corefile"))

	// Every bootstrap object is at the target: its server-side apply under Talos' manager
	// would change nothing (but Helm's ConfigMap, whose change is kept).
	objs := bootstrapObjects(t, c)
	dyn, mapper := dynamicFor(t, c)
	inv, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, simmanifests.InventoryName, metav1.GetOptions{})
	require.NoError(t, err)

	for _, obj := range objs {
		name := obj.GetKind() + " " + obj.GetNamespace() + "/" + obj.GetName()
		if name == "ConfigMap kube-system/coredns" {
			continue
		}

		requireAtManifest(t, dyn, mapper, obj)

		key := obj.GetNamespace()
		if m, err := mapper.RESTMapping(obj.GroupVersionKind().GroupKind()); err == nil && m.Scope.Name() != meta.RESTScopeNameNamespace {
			key = ""
		}

		obj.SetNamespace(key)
		assert.Contains(t, inv.Data, simmanifests.InventoryKey(obj), "%s in Talos' inventory", name)
	}

	// talosctl upgrade-k8s' sync after ichor's prunes nothing ichor synced.
	restConfig, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	require.NoError(t, err)

	applier, err := simmanifests.NewApplier(restConfig, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)

	res, err := applier.SyncAsUpgradeK8s(ctx, bootstrapObjects(t, c))
	require.NoError(t, err)
	assert.Empty(t, res.Pruned)
}

// TestJobKubeProxyRolloutHeldNotReadyNode powers a worker off and holds it, as plan
// advises for a NotReady node: plan warns that its kube-proxy pod will keep the
// DaemonSet's rollout (maxUnavailable 1) from moving; the upgrade through the Job pauses
// at the KubeProxy stage's rollout with that cause within minutes, not at the 20-minute
// verify bound. Once the worker is back, resume finishes.
func TestJobKubeProxyRolloutHeldNotReadyNode(t *testing.T) {
	t.Parallel()

	faults := filepath.Join(t.TempDir(), "faults.yaml")
	require.NoError(t, os.WriteFile(faults, nil, 0o644))

	c := startJobCluster(t, "--control-planes", "1", "--faults", faults)
	ctx := context.Background()

	require.NoError(t, os.WriteFile(faults, []byte("nodes:\n  worker-2:\n    poweredOff: true\n"), 0o644))
	eventually(t, 2*time.Minute, "worker-2 NotReady", func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if nodeReady(n) {
			return errors.New("still Ready")
		}

		return nil
	})

	out, err := c.kubectl(t, "annotate", "node", "worker-2", "ichor.dev/hold=powered off")
	require.NoError(t, err, out)

	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)
	check := tableChecks(r.stdout)["kube-proxy rollout"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "worker-2 (held) NotReady: its kube-proxy pod cannot become Ready and takes 1 of the DaemonSet's 1 unavailable slot(s)")
	require.Contains(t, check.detail, "kubectl delete node worker-2")

	start := time.Now()
	r = c.ichor(t, 15*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, job.ExitPaused)
	require.Contains(t, r.stderr, "paused: KubeProxy")

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	assert.Equal(t, "KubeProxy", op.Status.Stage)
	assert.Contains(t, op.Status.Reason, "kube-proxy rollout cannot progress")
	assert.Contains(t, op.Status.Reason, "worker-2 is NotReady")
	assert.Contains(t, op.Status.Reason, "unavailable slot(s) (maxUnavailable)")
	assert.Contains(t, op.Status.Action, "kubectl delete node worker-2")
	assert.Less(t, time.Since(start), 10*time.Minute, "paused on the cause, not at the 20-minute verify bound")

	// The worker comes back: its kube-proxy pod runs, the rollout finishes.
	require.NoError(t, os.WriteFile(faults, nil, 0o644))
	eventually(t, 3*time.Minute, "worker-2 Ready", func(ctx context.Context) error {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, "worker-2", metav1.GetOptions{})
		if err != nil {
			return err
		}

		if !nodeReady(n) {
			return errors.New("not yet")
		}

		return nil
	})

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(ctx, "kube-proxy", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, ds.Spec.Template.Spec.Containers[0].Image, ":v1.36.3")
	assert.Equal(t, ds.Status.DesiredNumberScheduled, ds.Status.NumberAvailable)
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

// managerOps lists the managed fields' entries of the object itself (not of a
// subresource, such as the controllers' status) as "manager/operation".
func managerOps(mf []metav1.ManagedFieldsEntry) []string {
	var out []string
	for _, e := range mf {
		if e.Subresource == "" {
			out = append(out, e.Manager+"/"+string(e.Operation))
		}
	}

	return out
}

// ownsFieldAs reports whether manager, through operation, owns field.
func ownsFieldAs(mf []metav1.ManagedFieldsEntry, manager string, op metav1.ManagedFieldsOperationType, field string) bool {
	for _, e := range mf {
		if e.Manager == manager && e.Operation == op && e.FieldsV1 != nil && strings.Contains(string(e.FieldsV1.Raw), `"`+field+`"`) {
			return true
		}
	}

	return false
}

// bootstrapObjects are the bootstrap manifests' objects of the cluster's first control
// plane, read through its Talos API.
func bootstrapObjects(t *testing.T, c *Cluster) []*unstructured.Unstructured {
	t.Helper()

	tcl, err := client.New(context.Background(), client.WithConfigFromFile(c.Talosconfig))
	require.NoError(t, err)
	t.Cleanup(func() { _ = tcl.Close() })

	ctx := client.WithNode(context.Background(), c.Info.Machines[0].IP)

	list, err := safe.StateListAll[*k8s.Manifest](ctx, tcl.COSI)
	require.NoError(t, err)

	var out []*unstructured.Unstructured

	for m := range list.All() {
		for _, item := range m.TypedSpec().Items {
			out = append(out, (&unstructured.Unstructured{Object: item.Object}).DeepCopy())
		}
	}

	require.NotEmpty(t, out)

	return out
}

// dynamicFor is a dynamic client and a REST mapper to c's cluster.
func dynamicFor(t *testing.T, c *Cluster) (dynamic.Interface, meta.RESTMapper) {
	t.Helper()

	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	require.NoError(t, err)

	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	require.NoError(t, err)

	return dynamic.NewForConfigOrDie(cfg), restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
}

// requireAtManifest checks that obj's live copy is what its manifest says: a server-side
// dry run of the manifest under Talos' field manager, unforced, meets no conflict and
// would change nothing.
func requireAtManifest(t *testing.T, dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) {
	t.Helper()

	ctx := context.Background()
	name := obj.GetKind() + " " + obj.GetNamespace() + "/" + obj.GetName()

	m, err := mapper.RESTMapping(obj.GroupVersionKind().GroupKind(), obj.GroupVersionKind().Version)
	require.NoError(t, err, name)

	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	} else {
		obj = obj.DeepCopy()
		obj.SetNamespace("")
	}

	live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	require.NoError(t, err, name)

	// As the sync applies it: with the live object's inventory mark.
	obj = obj.DeepCopy()
	if v, ok := live.GetAnnotations()[simmanifests.InventoryAnnotation]; ok {
		a := obj.GetAnnotations()
		if a == nil {
			a = map[string]string{}
		}

		a[simmanifests.InventoryAnnotation] = v
		obj.SetAnnotations(a)
	}

	data, err := obj.MarshalJSON()
	require.NoError(t, err)

	dry, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "talos", DryRun: []string{metav1.DryRunAll}})
	require.NoError(t, err, "%s: a conflict or a refusal", name)

	strip := func(u *unstructured.Unstructured) map[string]any {
		c := u.DeepCopy()
		c.SetManagedFields(nil)
		c.SetResourceVersion("")
		unstructured.RemoveNestedField(c.Object, "status")

		return c.Object
	}

	assert.True(t, reflect.DeepEqual(strip(live), strip(dry)), "%s is not at its manifest:\nlive %v\ndry  %v", name, strip(live), strip(dry))
}

// TestPlanTalosKernelArgs: two workers set machine.install.extraKernelArgs, one booting
// with GRUB (its own command line), one a UKI with systemd-boot. plan talos warns about
// the GRUB one only: Talos' lifecycle upgrade would boot it without them.
func TestPlanTalosKernelArgs(t *testing.T) {
	t.Parallel()

	c := startCluster(t, "--control-planes", "1", "--workers", "2", "--kubernetes", "v1.35.4", "--talos", "v1.13.9",
		"--kernel-args", "worker-1=console=ttyS1,net.ifnames=0", "--kernel-args", "worker-2=console=ttyS1",
		"--boot-loader", "worker-2=sd-boot")

	r := c.ichor(t, 2*time.Minute, "plan", "talos", "--to", "v1.14.1")
	check := tableChecks(r.stdout)["kernel arguments"]
	require.Equal(t, api.ResultWarn, check.result, r.stdout)
	require.Contains(t, check.detail, "worker-1 (console=ttyS1 net.ifnames=0): GRUB without the UKI command line")
	require.NotContains(t, check.detail, "worker-2")
	require.Contains(t, check.detail, "customization.extraKernelArgs")
}
