package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	fakediscovery "k8s.io/client-go/discovery/fake"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/discovery/discoverytest"
	"github.com/ichor-dev/kubectl-ichor/pkg/job"
)

func manifestObject(apiVersion, kind, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)

	return u
}

// flakyManifests is a Talos whose node down does not answer for its manifests.
type flakyManifests struct {
	*discoverytest.FakeTalos
	down string
}

func (f flakyManifests) Manifests(ctx context.Context, node string) ([]*unstructured.Unstructured, error) {
	if node == f.down {
		return nil, errors.New("unreachable")
	}

	return f.FakeTalos.Manifests(ctx, node)
}

// flat lists rules one permission a line: "verb resource names".
func flat(rules []rbacv1.PolicyRule) []string {
	var out []string

	for _, r := range rules {
		for _, v := range r.Verbs {
			for _, res := range r.Resources {
				out = append(out, strings.TrimSpace(v+" "+res+" "+strings.Join(r.ResourceNames, ",")))
			}
		}
	}

	return out
}

// TestUpgradeGivesTheJobTheManifestsByName: `upgrade kubernetes` reads the bootstrap
// manifests through Talos (from the next control plane when one does not answer) and gives
// the Job exactly their objects by name; a kind the cluster does not serve is a warning.
func TestUpgradeGivesTheJobTheManifestsByName(t *testing.T) {
	c := newJobCluster(talosSecret())
	cluster := fixture()

	d := fakeDeps(cluster, nil)
	kube := d.kube
	d.kube = func(f *genericclioptions.ConfigFlags) (*kubeTarget, error) {
		target, err := kube(f)
		if err != nil {
			return nil, err
		}

		disc, ok := target.client.Discovery().(*fakediscovery.FakeDiscovery)
		require.True(t, ok)
		disc.Resources = []*metav1.APIResourceList{
			{GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "secrets", Kind: "Secret", Namespaced: true}}},
			{GroupVersion: "apps/v1", APIResources: []metav1.APIResource{{Name: "daemonsets", Kind: "DaemonSet", Namespaced: true}}},
			{GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "clusterrolebindings", Kind: "ClusterRoleBinding"}}},
		}

		return target, nil
	}

	objs := []*unstructured.Unstructured{
		manifestObject("apps/v1", "DaemonSet", "kube-system", "kube-proxy"),
		manifestObject("v1", "Secret", "kube-system", "bootstrap-token-abcdef"),
		manifestObject("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "", "kube-proxy"),
		manifestObject("example.com/v1", "Gadget", "", "g1"),
	}
	d.talos = func(context.Context, TalosFlags) (discovery.TalosReader, error) {
		f := cluster.Talos()
		f.ManifestObjects = map[string][]*unstructured.Unstructured{}

		for _, ip := range []string{"10.0.0.11", "10.0.0.12", "10.0.0.13"} {
			f.ManifestObjects[ip] = objs
		}

		return flakyManifests{FakeTalos: f, down: "10.0.0.11"}, nil
	}

	_, stderr, code := runWith(t, c.with(d), "upgrade", "kubernetes", "--to", "v1.36.3", "--yes", "--detach")
	require.Equal(t, ExitOK, code, stderr)
	assert.Contains(t, stderr, "warning: the Job may not re-apply Gadget g1: the cluster does not serve kind Gadget.example.com")

	ctx := context.Background()
	cr, err := c.kube.RbacV1().ClusterRoles().Get(ctx, job.ClusterRoleName(job.DefaultNamespace), metav1.GetOptions{})
	require.NoError(t, err)
	assert.Subset(t, flat(cr.Rules), []string{"patch clusterrolebindings kube-proxy", "get clusterrolebindings kube-proxy", "create clusterrolebindings kube-proxy"})

	role, err := c.kube.RbacV1().Roles("kube-system").Get(ctx, job.BindingName(job.DefaultNamespace), metav1.GetOptions{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{
		"create daemonsets kube-proxy", "get daemonsets kube-proxy", "patch daemonsets kube-proxy",
		"create secrets bootstrap-token-abcdef", "get secrets bootstrap-token-abcdef", "patch secrets bootstrap-token-abcdef",
		// The cluster's one lock lives in kube-system too.
		"create leases", "get leases ichor-lock", "update leases ichor-lock", "watch leases ichor-lock",
		// And Talos' inventory of the manifests: the sync records what it synced.
		"get configmaps talos-bootstrap-manifests-inventory", "update configmaps talos-bootstrap-manifests-inventory",
	}, flat(role.Rules))
}
