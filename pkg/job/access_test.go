package job

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// bootstrapManifests are objects shaped like Talos' bootstrap manifests (kube-proxy,
// CoreDNS, Flannel, the kubelet bootstrap token and CSR approval, the talos.dev CRD),
// plus an inline manifest that binds cluster-admin and one of a kind nobody serves.
const bootstrapManifests = `
apiVersion: v1
kind: ServiceAccount
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: kube-proxy}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-proxier}
subjects: [{kind: ServiceAccount, name: kube-proxy, namespace: kube-system}]
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: kube-proxy, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system}
---
apiVersion: v1
kind: Secret
metadata: {name: bootstrap-token-abcdef, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system-bootstrap-node-bootstrapper}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:node-bootstrapper}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: Group, name: system:bootstrappers}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: flannel-leases, namespace: kube-system}
rules:
- apiGroups: [coordination.k8s.io]
  resources: [leases]
  verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: flannel-leases, namespace: kube-system}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: flannel-leases}
subjects: [{kind: ServiceAccount, name: flannel, namespace: kube-system}]
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets}
---
apiVersion: example.com/v1
kind: Widget
metadata: {name: w1, namespace: tools}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: helm-all}
rules:
- apiGroups: ["*"]
  resources: ["*"]
  verbs: ["*"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: helm-all}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: helm-all}
subjects: [{kind: ServiceAccount, name: helm, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ci-admin}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: cluster-admin}
subjects: [{kind: ServiceAccount, name: ci, namespace: kube-system}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: agg}
aggregationRule:
  clusterRoleSelectors: [{matchLabels: {x: "y"}}]
---
apiVersion: unknown.example.com/v1
kind: Gadget
metadata: {name: g1}
`

func parseManifests(t *testing.T, text string) []*unstructured.Unstructured {
	t.Helper()

	var out []*unstructured.Unstructured

	for _, doc := range splitYAML(text) {
		m := map[string]any{}
		require.NoError(t, yaml.Unmarshal([]byte(doc), &m))
		out = append(out, &unstructured.Unstructured{Object: m})
	}

	return out
}

func splitYAML(text string) []string {
	var docs []string

	for _, d := range strings.Split(text, "\n---\n") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}

	return docs
}

// testMapper maps the kinds a cluster serves (not Widget, not Gadget).
func testMapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper(nil)
	add := func(group, version, kind, resource string, scope meta.RESTScope) {
		gv := schema.GroupVersion{Group: group, Version: version}
		m.AddSpecific(gv.WithKind(kind), gv.WithResource(resource), gv.WithResource(resource), scope)
	}

	add("", "v1", "ServiceAccount", "serviceaccounts", meta.RESTScopeNamespace)
	add("", "v1", "ConfigMap", "configmaps", meta.RESTScopeNamespace)
	add("", "v1", "Secret", "secrets", meta.RESTScopeNamespace)
	add("", "v1", "Service", "services", meta.RESTScopeNamespace)
	add("apps", "v1", "DaemonSet", "daemonsets", meta.RESTScopeNamespace)
	add("apps", "v1", "Deployment", "deployments", meta.RESTScopeNamespace)
	add("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", meta.RESTScopeRoot)
	add("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", meta.RESTScopeRoot)
	add("rbac.authorization.k8s.io", "v1", "Role", "roles", meta.RESTScopeNamespace)
	add("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", meta.RESTScopeNamespace)
	add("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", meta.RESTScopeRoot)

	return m
}

func TestComputeAccess(t *testing.T) {
	a, err := ComputeAccess(parseManifests(t, bootstrapManifests), testMapper())
	require.NoError(t, err)

	// Each object by name: read, and server-side apply; nothing else.
	assert.Equal(t, sortedCopy([]string{
		"create clusterrolebindings.rbac.authorization.k8s.io ci-admin,helm-all,kube-proxy,system-bootstrap-node-bootstrapper,system:coredns",
		"create clusterroles.rbac.authorization.k8s.io agg,helm-all,system:coredns",
		"create customresourcedefinitions.apiextensions.k8s.io widgets.example.com",
		"get clusterrolebindings.rbac.authorization.k8s.io ci-admin,helm-all,kube-proxy,system-bootstrap-node-bootstrapper,system:coredns",
		"get clusterroles.rbac.authorization.k8s.io agg,helm-all,system:coredns",
		"get customresourcedefinitions.apiextensions.k8s.io widgets.example.com",
		"patch clusterrolebindings.rbac.authorization.k8s.io ci-admin,helm-all,kube-proxy,system-bootstrap-node-bootstrapper,system:coredns",
		"patch clusterroles.rbac.authorization.k8s.io agg,helm-all,system:coredns",
		"patch customresourcedefinitions.apiextensions.k8s.io widgets.example.com",
	}), sortedCopy(flatRules(a.Cluster)))

	assert.Equal(t, []string{"kube-system", "tools"}, a.Namespaces())
	assert.Equal(t, sortedCopy([]string{
		"create configmaps coredns", "get configmaps coredns", "patch configmaps coredns",
		"create daemonsets.apps kube-proxy", "get daemonsets.apps kube-proxy", "patch daemonsets.apps kube-proxy",
		"create deployments.apps coredns", "get deployments.apps coredns", "patch deployments.apps coredns",
		"create rolebindings.rbac.authorization.k8s.io flannel-leases", "get rolebindings.rbac.authorization.k8s.io flannel-leases",
		"patch rolebindings.rbac.authorization.k8s.io flannel-leases",
		"create roles.rbac.authorization.k8s.io flannel-leases", "get roles.rbac.authorization.k8s.io flannel-leases",
		"patch roles.rbac.authorization.k8s.io flannel-leases",
		// Only the Secret the manifests name.
		"create secrets bootstrap-token-abcdef", "get secrets bootstrap-token-abcdef", "patch secrets bootstrap-token-abcdef",
		"create serviceaccounts kube-proxy", "get serviceaccounts kube-proxy", "patch serviceaccounts kube-proxy",
		"create services kube-dns", "get services kube-dns", "patch services kube-dns",
		// Talos' inventory of the objects: read, and record the objects synced.
		"get configmaps talos-bootstrap-manifests-inventory", "update configmaps talos-bootstrap-manifests-inventory",
	}), sortedCopy(flatRules(a.Namespaced["kube-system"])))
	assert.Equal(t, []string{"create widgets.example.com w1", "get widgets.example.com w1", "patch widgets.example.com w1"},
		flatRules(a.Namespaced["tools"]), "a kind defined by a CRD of the manifests")

	assert.Equal(t, []string{"Gadget g1: the cluster does not serve kind Gadget.unknown.example.com"}, a.Left)

	// Whatever the manifests grant or bind (here *, and cluster-admin), the runner never
	// gets escalate, bind, impersonate, a wildcard, a role's permissions, or a write
	// that is not by name.
	for _, rules := range [][]rbacv1.PolicyRule{a.Cluster, a.Namespaced["kube-system"], a.Namespaced["tools"]} {
		for _, r := range rules {
			if slices.Equal(r.ResourceNames, []string{kube.InventoryName}) && slices.Equal(r.Resources, []string{"configmaps"}) {
				assert.Equal(t, []string{"get", "update"}, r.Verbs, "the inventory: read and record, nothing else")

				continue
			}

			assert.Subset(t, ManifestVerbs(), r.Verbs)
			assert.NotContains(t, r.Resources, "*")
			assert.NotContains(t, r.APIGroups, "*")
			assert.NotEmpty(t, r.ResourceNames, "by name only: %+v", r)
		}
	}
}

func TestComputeAccessEmpty(t *testing.T) {
	a, err := ComputeAccess(nil, testMapper())
	require.NoError(t, err)
	assert.Empty(t, a.Cluster)
	assert.Empty(t, a.Namespaced)
	assert.Empty(t, a.Left)
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	slices.Sort(out)

	return out
}
