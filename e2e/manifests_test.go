//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

// TestJobManifestsKeepAnotherManagersChange changes a bootstrap manifest object live
// with another field manager (as Helm would), then upgrades through the Job: the sync,
// a dry run first and no force, skips that object and says so, applies the others and
// the upgrade succeeds with the change kept. A --manifests-force that names no object is
// refused up front.
func TestJobManifestsKeepAnotherManagersChange(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t)
	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	cms := c.Client.CoreV1().ConfigMaps("kube-system")

	cm, err := cms.Get(ctx, "coredns", metav1.GetOptions{})
	require.NoError(t, err)

	const mark = "# changed by helm"

	cm.Data["Corefile"] += "\n" + mark + "\n"
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "helm"})
	require.NoError(t, err)

	// The plan says it, as a check, before anything runs.
	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)
	check := tableChecks(r.stdout)["bootstrap manifests"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "changed by another field manager, the sync skips them: ConfigMap kube-system/coredns")
	require.Contains(t, check.detail, `conflict with "helm"`)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.Contains(t, r.stdout, "skipped 1 changed by another field manager: ConfigMap kube-system/coredns")

	op := c.operation(t)
	assert.Equal(t, api.PhaseSucceeded, op.Status.Phase)

	cm, err = cms.Get(ctx, "coredns", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Contains(t, cm.Data["Corefile"], mark, "the other manager's change is kept")

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))

	// A bad name is refused up front.
	r = c.ichor(t, time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--manifests-force", "coredns")
	r.requireExit(t, 1)
	r.requireOneLineError(t, `--manifests-force "coredns": name an object as "Kind namespace/name"`)
}

// inlineManifest writes contents to a file and returns the ichor-sim up flags that
// give every control plane of the cluster it as inline manifest name
// (cluster.inlineManifests).
func inlineManifest(t *testing.T, name, contents string) []string {
	t.Helper()

	file := filepath.Join(t.TempDir(), name+".yaml")
	require.NoError(t, os.WriteFile(file, []byte(contents), 0o644))

	return []string{"--inline-manifest", name + "=" + file}
}

// ownsField reports whether manager has applied field ("f:image", ...) of the object
// whose managed fields are mf.
func ownsField(mf []metav1.ManagedFieldsEntry, manager, field string) bool {
	for _, e := range mf {
		if e.Manager == manager && e.FieldsV1 != nil && strings.Contains(string(e.FieldsV1.Raw), `"`+field+`"`) {
			return true
		}
	}

	return false
}

// containerImage is the image of the first container of DaemonSet kube-system/name.
func containerImage(t *testing.T, c *Cluster, name string) (string, []metav1.ManagedFieldsEntry) {
	t.Helper()

	ds, err := c.Client.AppsV1().DaemonSets("kube-system").Get(context.Background(), name, metav1.GetOptions{})
	require.NoError(t, err)

	return ds.Spec.Template.Spec.Containers[0].Image, ds.ManagedFields
}

// stepEvents are the messages of the operation's Step events.
func stepEvents(t *testing.T, c *Cluster) []string {
	t.Helper()

	list, err := c.Client.CoreV1().Events(jobNamespace).List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)

	var out []string

	for _, e := range list.Items {
		if e.Reason == "Step" && e.Type == corev1.EventTypeNormal {
			out = append(out, e.Message)
		}
	}

	return out
}

const flannelManifest = `apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-flannel-cfg
  namespace: kube-system
data:
  net-conf.json: '{"Network": "10.244.0.0/16"}'
---
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: kube-flannel
  namespace: kube-system
  labels:
    app: flannel
spec:
  selector:
    matchLabels:
      app: flannel
  template:
    metadata:
      labels:
        app: flannel
    spec:
      tolerations:
      - operator: Exists
      containers:
      - name: kube-flannel
        image: ghcr.io/flannel-io/flannel:v0.25.0
`

// TestJobInlineManifestKeepsHelmsUpgrade bootstraps a CNI inline (a DaemonSet in the
// control planes' cluster.inlineManifests, which Talos renders as bootstrap manifest
// 99-flannel and re-renders for every target), then upgrades it live with Helm's field
// manager through server-side apply. plan shows it in the bootstrap manifests check; an
// upgrade through the Job keeps Helm's image and says it skipped the DaemonSet; the next
// upgrade with --manifests-force naming it takes the image back for Talos.
func TestJobInlineManifestKeepsHelmsUpgrade(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, inlineManifest(t, "flannel", flannelManifest)...)
	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	const (
		bootstrapped = "ghcr.io/flannel-io/flannel:v0.25.0"
		helms        = "ghcr.io/flannel-io/flannel:v0.26.1"
		object       = "DaemonSet kube-system/kube-flannel"
	)

	image, mf := containerImage(t, c, "kube-flannel")
	require.Equal(t, bootstrapped, image, "Talos created the inline manifest's DaemonSet")
	require.True(t, ownsField(mf, "talos", "f:image"), "Talos owns its image")

	force := true
	_, err := c.Client.AppsV1().DaemonSets("kube-system").Patch(ctx, "kube-flannel", types.ApplyPatchType, []byte(fmt.Sprintf(
		`{"apiVersion":"apps/v1","kind":"DaemonSet","metadata":{"name":"kube-flannel","namespace":"kube-system"},`+
			`"spec":{"template":{"spec":{"containers":[{"name":"kube-flannel","image":%q}]}}}}`, helms)),
		metav1.PatchOptions{FieldManager: "helm", Force: &force})
	require.NoError(t, err)

	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.35.5")
	r.requireExit(t, 0)
	check := tableChecks(r.stdout)["bootstrap manifests"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, "changed by another field manager, the sync skips them: "+object)
	require.Contains(t, check.detail, `conflict with "helm"`)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.35.5", "--yes")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.Contains(t, r.stdout, "skipped 1 changed by another field manager: "+object)
	assert.Contains(t, strings.Join(stepEvents(t, c), "\n"), "skipped 1 changed by another field manager: "+object, "the operation's events keep it")
	assert.Equal(t, api.PhaseSucceeded, c.operation(t).Status.Phase)

	r = c.ichor(t, time.Minute, "status")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^  bootstrap manifests: applied \d+ .*; skipped 1 changed by another field manager: `+object+`$`, r.stdout,
		"the finished operation still says what the sync left alone")

	image, mf = containerImage(t, c, "kube-flannel")
	assert.Equal(t, helms, image, "Helm's upgrade is kept")
	assert.True(t, ownsField(mf, "helm", "f:image"))
	requireUpgraded(t, c, tc, before, "v1.35.5")

	// Asked by name, the sync takes the field over.
	before = machineConfigs(t, c, tc)
	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--manifests-force", object)
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)
	require.NotContains(t, r.stdout, "skipped")

	image, mf = containerImage(t, c, "kube-flannel")
	assert.Equal(t, bootstrapped, image, "forced: the manifest's image is back")
	assert.True(t, ownsField(mf, "talos", "f:image"))
	assert.False(t, ownsField(mf, "helm", "f:image"))

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

const gadgetManifest = `apiVersion: v1
kind: ConfigMap
metadata:
  name: gadget-config
  namespace: kube-system
data:
  size: "1"
---
apiVersion: example.com/v1
kind: Gadget
metadata:
  name: g1
  namespace: default
spec:
  size: 1
`

const gadgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.example.com
spec:
  group: example.com
  names:
    kind: Gadget
    listKind: GadgetList
    plural: gadgets
    singular: gadget
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
`

// TestJobManifestKindNotServedPausesThenResumes bootstraps an inline manifest holding a
// Gadget, a kind the cluster does not serve (its CRD was never installed: Talos leaves
// it out at bootstrap). The Job's access to the manifests, computed at launch, cannot
// cover it: plan warns, the launch says so, and the KubeProxy stage's sync pauses
// before it changes anything (kube-proxy stays at the old version), naming the object
// and what to do. Once the operator installs the CRD, resume grants the Job the object
// and finishes, the Gadget created by Talos' field manager.
func TestJobManifestKindNotServedPausesThenResumes(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, inlineManifest(t, "gadgets", gadgetManifest)...)
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	const object = "Gadget default/g1"

	_, err := c.Client.CoreV1().ConfigMaps("kube-system").Get(context.Background(), "gadget-config", metav1.GetOptions{})
	require.NoError(t, err, "Talos applied the rest of the inline manifest")

	r := c.ichor(t, 2*time.Minute, "plan", "kubernetes", "--to", "v1.36.3")
	r.requireExit(t, 0)
	check := tableChecks(r.stdout)["bootstrap manifests"]
	require.Equal(t, api.ResultWarn, check.result)
	require.Contains(t, check.detail, object)

	r = c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, job.ExitPaused)
	require.Contains(t, r.stderr, "warning: the Job may not re-apply Gadget g1: the cluster does not serve kind Gadget.example.com")
	require.Contains(t, r.stderr, "paused: KubeProxy ")

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	assert.Equal(t, "KubeProxy", op.Status.Stage)
	assert.Contains(t, op.Status.Reason, "sync bootstrap manifests (0 of ")
	assert.Contains(t, op.Status.Reason, "dry-run apply "+object)
	assert.Contains(t, op.Status.Action, "install its CustomResourceDefinition")
	assert.True(t, strings.HasSuffix(op.Status.Action, ", then resume"), op.Status.Action)
	require.Contains(t, r.stderr, ", then kubectl ichor resume\n", "the error names the command once")

	// The dry run stopped the sync before it changed anything.
	image, _ := containerImage(t, c, "kube-proxy")
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.35.4", image, "nothing applied: kube-proxy not moved")

	// The operator installs the kind; resume recomputes the Job's access and finishes.
	crd := filepath.Join(t.TempDir(), "crd.yaml")
	require.NoError(t, os.WriteFile(crd, []byte(gadgetCRD), 0o644))
	out, err := c.kubectl(t, "apply", "-f", crd)
	require.NoError(t, err, out)
	out, err = c.kubectl(t, "wait", "--for=condition=Established", "crd/gadgets.example.com", "--timeout=60s")
	require.NoError(t, err, out)

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	out, err = c.kubectl(t, "get", "gadgets.example.com", "g1", "-n", "default", "-o", "jsonpath={.metadata.managedFields[*].manager}")
	require.NoError(t, err, out)
	assert.Equal(t, "talos", out, "the sync created the Gadget as Talos would")

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}

const readerRoleManifest = `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: cni-secrets-reader
rules:
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
`

// TestJobManifestRoleTheJobMayNotCreate bootstraps, on Talos 1.14, an inline manifest
// holding a ClusterRole that grants what the Job does not hold (reading every Secret),
// then deletes it live. Talos does not create it again (it is in Talos' inventory, which
// Talos 1.13 and later keep; 1.12 would, on its next render). The Job may re-apply the role as it is, never
// create it: Kubernetes refuses the create as an escalation. The sync's dry run pauses the stage before it changes
// anything, naming the role and what to do; once the operator re-creates the role,
// resume finishes and the role is as the manifest says.
func TestJobManifestRoleTheJobMayNotCreate(t *testing.T) {
	t.Parallel()

	c := startJobCluster(t, append(inlineManifest(t, "cni-rbac", readerRoleManifest), "--talos", "v1.14.1")...)
	ctx := context.Background()
	tc := openTalos(t, c)
	before := machineConfigs(t, c, tc)

	const object = "ClusterRole cni-secrets-reader"

	roles := c.Client.RbacV1().ClusterRoles()
	_, err := roles.Get(ctx, "cni-secrets-reader", metav1.GetOptions{})
	require.NoError(t, err, "Talos created the inline manifest's role")
	require.NoError(t, roles.Delete(ctx, "cni-secrets-reader", metav1.DeleteOptions{}))

	r := c.ichor(t, 10*time.Minute, "upgrade", "kubernetes", "--to", "v1.36.3", "--yes")
	r.requireExit(t, job.ExitPaused)
	require.Contains(t, r.stderr, "paused: KubeProxy ")

	op := c.operation(t)
	require.Equal(t, api.PhasePaused, op.Status.Phase)
	assert.Equal(t, "KubeProxy", op.Status.Stage)
	assert.Contains(t, op.Status.Reason, "sync bootstrap manifests (0 of ")
	assert.Contains(t, op.Status.Reason, "dry-run apply "+object)
	assert.Contains(t, op.Status.Reason, "forbidden")
	assert.Contains(t, op.Status.Action, "the Job may not write the object")
	assert.Contains(t, op.Status.Action, "apply it yourself as a cluster admin")

	image, _ := containerImage(t, c, "kube-proxy")
	assert.Equal(t, "registry.k8s.io/kube-proxy:v1.35.4", image, "nothing applied: kube-proxy not moved")

	_, err = roles.Get(ctx, "cni-secrets-reader", metav1.GetOptions{})
	require.True(t, apierrors.IsNotFound(err), "the role is not created: %v", err)

	// The operator re-creates the role; the Job may re-apply it as it is.
	file := filepath.Join(t.TempDir(), "role.yaml")
	require.NoError(t, os.WriteFile(file, []byte(readerRoleManifest), 0o644))
	out, err := c.kubectl(t, "apply", "--server-side", "-f", file)
	require.NoError(t, err, out)

	r = c.ichor(t, 10*time.Minute, "resume")
	r.requireExit(t, 0)
	require.Regexp(t, `(?m)^Succeeded in \d`, r.stdout)

	role, err := roles.Get(ctx, "cni-secrets-reader", metav1.GetOptions{})
	require.NoError(t, err)
	assert.Equal(t, []string{"get", "list", "watch"}, role.Rules[0].Verbs)

	requireUpgraded(t, c, tc, before, "v1.36.3")
	requireNothingCordoned(t, c)
	assert.Empty(t, invariantBreaks(c.Events(t)))
}
