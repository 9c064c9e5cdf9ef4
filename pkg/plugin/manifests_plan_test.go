package plugin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
)

// TestPlanDryRunsTheManifestsAtTheTarget: plan dry-runs the bootstrap manifests as the
// run will apply them, rendered for the target: the kube-proxy DaemonSet at
// kube-proxy:v1.36.3, whose image Helm holds, conflicts only there. The plan refuses,
// naming Helm and the flag, before anything changes; with the flag the check passes.
func TestPlanDryRunsTheManifestsAtTheTarget(t *testing.T) {
	c := fixture()
	d := fakeDeps(c, nil)

	var patched []string

	d.kube = func(*genericclioptions.ConfigFlags) (*kubeTarget, error) {
		cs := c.Clientset()
		cs.Resources = []*metav1.APIResourceList{
			{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "serviceaccounts", Kind: "ServiceAccount", Namespaced: true}}},
			{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "daemonsets", Kind: "DaemonSet", Namespaced: true}}},
		}

		dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
		dyn.PrependReactor("patch", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
			p, _ := action.(k8stesting.PatchActionImpl)

			obj := &unstructured.Unstructured{}
			require.NoError(t, obj.UnmarshalJSON(p.GetPatch()))

			image := ""
			if cs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers"); len(cs) > 0 {
				image, _ = cs[0].(map[string]any)["image"].(string)
			}

			patched = append(patched, obj.GetKind()+" "+image)

			// Helm holds the image: an apply that changes it conflicts.
			if image != "" && image != "registry.k8s.io/kube-proxy:v1.35.4" && !*p.PatchOptions.Force {
				msg := `conflict with "helm" using apps/v1`

				return true, nil, apierrors.NewApplyConflict([]metav1.StatusCause{{Type: metav1.CauseTypeFieldManagerConflict, Message: msg,
					Field: `.spec.template.spec.containers[name="kube-proxy"].image`}}, "Apply failed with 1 conflict: "+msg+`: .spec.template.spec.containers[name="kube-proxy"].image`)
			}

			return true, obj, nil
		})

		return &kubeTarget{client: cs, dynamic: dyn, endpoint: discoverytest.Endpoint, cluster: "lab", metrics: fakeMetrics{body: removedAPIMetrics}}, nil
	}

	ds := manifestObject("apps/v1", "DaemonSet", "kube-system", "kube-proxy")
	require.NoError(t, unstructured.SetNestedSlice(ds.Object, []any{map[string]any{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.35.4"}},
		"spec", "template", "spec", "containers"))

	d.talos = func(context.Context, TalosFlags) (discovery.TalosReader, error) {
		f := c.Talos()
		f.ManifestObjects = map[string][]*unstructured.Unstructured{}

		for _, ip := range []string{"10.0.0.11", "10.0.0.12", "10.0.0.13"} {
			f.ManifestObjects[ip] = []*unstructured.Unstructured{ds, manifestObject("v1", "ServiceAccount", "kube-system", "kube-proxy")}
		}

		return f, nil
	}

	stdout, stderr, code := runWith(t, d, "plan", "kubernetes", "--to", "v1.36.3", "-o", "json")
	assert.Equal(t, ExitRefused, code, stderr)
	assert.Contains(t, patched, "DaemonSet registry.k8s.io/kube-proxy:v1.36.3", "dry-run at the target's image")

	check := planCheck(t, stdout, "bootstrap manifests")
	assert.Equal(t, "REFUSED", string(check.Result))
	assert.Contains(t, check.Detail, `DaemonSet kube-system/kube-proxy of cp-1 at v1.36.3: field manager "helm" (Update) holds fields the sync would change`)
	assert.Contains(t, check.Action, `--manifests-force "DaemonSet kube-system/kube-proxy"`)

	// Forced, as the run would be with the flag: the sync takes it over.
	stdout, stderr, code = runWith(t, d, "plan", "kubernetes", "--to", "v1.36.3", "-o", "json", "--manifests-force", "DaemonSet kube-system/kube-proxy")
	assert.Equal(t, ExitOK, code, stderr)
	assert.Equal(t, "OK", string(planCheck(t, stdout, "bootstrap manifests").Result))
}

// planCheck is the check named name of a Plan document printed as JSON.
func planCheck(t *testing.T, stdout, name string) api.Check {
	t.Helper()

	var plan api.Plan
	require.NoError(t, json.Unmarshal([]byte(stdout), &plan), stdout)

	for _, c := range plan.Checks {
		if c.Name == name {
			return c
		}
	}

	t.Fatalf("no check %q in the plan", name)

	return api.Check{}
}
