package job

import (
	"fmt"
	"slices"
	"sort"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

// ManifestVerbs are what the runner may do to each object of the bootstrap manifests, by
// name: read it (to compare it with the manifest) and server-side apply it (a patch, which
// creates it when it is missing; a create through server-side apply is authorized with the
// object's name).
func ManifestVerbs() []string { return []string{"get", "create", "patch"} }

// ManifestAccess is what the runner may do in the cluster to re-apply Talos' bootstrap
// manifests, computed at launch from the manifests themselves (ComputeAccess): each object
// by its name, never a kind as a whole, and Talos' inventory of them (read it, record the
// objects synced). It holds no escalate, no bind and none of the
// permissions the manifests' roles grant: the apiserver lets it re-apply a Role,
// ClusterRole or binding of the manifests unchanged (an apply that changes nothing is not
// an escalation), and refuses any change to one, so the runner can never grant itself or
// anyone anything.
type ManifestAccess struct {
	// Cluster are rules for the cluster-scoped objects.
	Cluster []rbacv1.PolicyRule `json:"cluster,omitempty"`
	// Namespaced are rules by namespace for the namespaced objects.
	Namespaced map[string][]rbacv1.PolicyRule `json:"namespaced,omitempty"`
	// Left are the objects the runner may not write, each with the reason, e.g.
	// "Gadget g1: the cluster does not serve kind Gadget.example.com".
	Left []string `json:"left,omitempty"`
}

// Namespaces are the namespaces the access has rules in, sorted.
func (a ManifestAccess) Namespaces() []string {
	return sortedStrings(a.Namespaced)
}

type objectKey struct{ group, resource, namespace string }

// ComputeAccess computes the runner's access to the bootstrap manifests objs: get, create
// and patch on each object by name, in its namespace (resources mapped by mapper, or by a
// CustomResourceDefinition of the manifests). A kind neither maps is left out (Left).
func ComputeAccess(objs []*unstructured.Unstructured, mapper meta.RESTMapper) (ManifestAccess, error) {
	crds := manifestCRDs(objs)
	names := map[objectKey][]string{}

	var left []string

	for _, o := range objs {
		gvk := o.GroupVersionKind()

		if o.GetName() == "" {
			left = append(left, fmt.Sprintf("%s without a name", gvk.Kind))

			continue
		}

		resource, namespaced, err := resourceOf(gvk, mapper, crds)
		if err != nil {
			left = append(left, fmt.Sprintf("%s %s: %v", gvk.Kind, o.GetName(), err))

			continue
		}

		ns := ""
		if namespaced {
			ns = o.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
			}
		}

		key := objectKey{group: gvk.Group, resource: resource, namespace: ns}
		names[key] = append(names[key], o.GetName())
	}

	a := ManifestAccess{Left: left}

	if len(objs) > 0 {
		// Talos 1.13+ keeps an inventory of the objects: the sync records in it those it
		// synced, as Talos' own pass does (kube.ManifestApplier.Sync).
		key := objectKey{resource: "configmaps", namespace: kube.InventoryNamespace}
		a.Namespaced = map[string][]rbacv1.PolicyRule{key.namespace: {{
			APIGroups: []string{""}, Resources: []string{key.resource}, Verbs: kube.InventoryVerbs(), ResourceNames: []string{kube.InventoryName},
		}}}
	}

	for _, k := range sortedKeys(names) {
		rule := rbacv1.PolicyRule{APIGroups: []string{k.group}, Resources: []string{k.resource}, Verbs: ManifestVerbs(), ResourceNames: uniqueSorted(names[k])}

		if k.namespace == "" {
			a.Cluster = append(a.Cluster, rule)

			continue
		}

		if a.Namespaced == nil {
			a.Namespaced = map[string][]rbacv1.PolicyRule{}
		}

		a.Namespaced[k.namespace] = append(a.Namespaced[k.namespace], rule)
	}

	return a, nil
}

type crdNames struct {
	plural     string
	namespaced bool
}

// manifestCRDs are the kinds the manifests' CustomResourceDefinitions define, which the
// cluster may not serve yet at launch.
func manifestCRDs(objs []*unstructured.Unstructured) map[schema.GroupKind]crdNames {
	out := map[schema.GroupKind]crdNames{}

	for _, o := range objs {
		if o.GroupVersionKind().GroupKind() != (schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}) {
			continue
		}

		group, _, _ := unstructured.NestedString(o.Object, "spec", "group")
		kind, _, _ := unstructured.NestedString(o.Object, "spec", "names", "kind")
		plural, _, _ := unstructured.NestedString(o.Object, "spec", "names", "plural")
		scope, _, _ := unstructured.NestedString(o.Object, "spec", "scope")

		if kind != "" && plural != "" {
			out[schema.GroupKind{Group: group, Kind: kind}] = crdNames{plural: plural, namespaced: scope != "Cluster"}
		}
	}

	return out
}

func resourceOf(gvk schema.GroupVersionKind, mapper meta.RESTMapper, crds map[schema.GroupKind]crdNames) (string, bool, error) {
	if mapper != nil {
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			return m.Resource.Resource, m.Scope.Name() == meta.RESTScopeNameNamespace, nil
		}
	}

	if c, ok := crds[gvk.GroupKind()]; ok {
		return c.plural, c.namespaced, nil
	}

	return "", false, fmt.Errorf("the cluster does not serve kind %s", gvk.GroupKind())
}

func uniqueSorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)

	return slices.Compact(out)
}

func sortedKeys[V any](m map[objectKey]V) []objectKey {
	keys := make([]objectKey, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}

	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.namespace != b.namespace {
			return a.namespace < b.namespace
		}

		if a.group != b.group {
			return a.group < b.group
		}

		return a.resource < b.resource
	})

	return keys
}

func sortedStrings[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}

	sort.Strings(keys)

	return keys
}
