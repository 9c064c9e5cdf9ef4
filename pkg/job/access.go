package job

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// ManifestVerbs are what the runner may do to each object of the bootstrap manifests, by
// name: read it (to compare it with the manifest) and server-side apply it (a patch, which
// creates it when it is missing; a create through server-side apply is authorized with the
// object's name).
func ManifestVerbs() []string { return []string{"get", "create", "patch"} }

// ManifestAccess is what the runner may do in the cluster to re-apply Talos' bootstrap
// manifests, computed at launch from the manifests themselves (ComputeAccess): each object
// by its name, never a kind as a whole. It never holds escalate; bind only on the exact
// roles the manifests' bindings reference and do not define.
type ManifestAccess struct {
	// Cluster are rules for cluster-scoped objects, and the rules of the manifests'
	// ClusterRoles, which the runner holds so that it may re-apply them without escalate.
	Cluster []rbacv1.PolicyRule `json:"cluster,omitempty"`
	// Namespaced are rules by namespace for namespaced objects (and the rules of the
	// manifests' Roles of that namespace).
	Namespaced map[string][]rbacv1.PolicyRule `json:"namespaced,omitempty"`
	// Left are the objects the runner may read but not write, each with the reason, e.g.
	// "ClusterRole x: grants escalate".
	Left []string `json:"left,omitempty"`
}

// Namespaces are the namespaces the access has rules in, sorted.
func (a ManifestAccess) Namespaces() []string {
	var ns []string
	for n := range a.Namespaced {
		ns = append(ns, n)
	}

	sort.Strings(ns)

	return ns
}

// RoleLookup returns the rules of a role that a binding of the manifests references and
// the manifests do not define (a built-in such as system:node-proxier): kind ClusterRole
// or Role, namespace "" for a ClusterRole. found is false when there is no such role.
type RoleLookup func(kind, namespace, name string) (rules []rbacv1.PolicyRule, found bool, err error)

type objectKey struct{ group, resource, namespace string }

// ComputeAccess computes the runner's access to the bootstrap manifests objs: get, create
// and patch on each object by name (resources mapped by mapper, or by a
// CustomResourceDefinition of the manifests); the rules of the manifests' roles (held, so
// that re-applying them needs no escalate, and changing them to grant more is refused);
// bind on each role a binding references that the manifests do not define. A role that
// grants escalate, bind, impersonate or any verb or resource "*" is not held, and a role
// lookup says the same of a referenced role: such objects are left read-only (Left), so
// the runner can never hand itself or anyone such powers. lookup may be nil (no bind is
// given then).
func ComputeAccess(objs []*unstructured.Unstructured, mapper meta.RESTMapper, lookup RoleLookup) (ManifestAccess, error) {
	crds := manifestCRDs(objs)
	names := map[objectKey][]string{}
	readOnly := map[objectKey][]string{}
	held := map[string][]rbacv1.PolicyRule{} // namespace ("" cluster) -> rules
	bind := map[objectKey][]string{}

	var left []string

	// Roles the manifests define, and whether the runner holds them.
	defined := map[string]bool{} // kind/namespace/name -> held

	for _, o := range objs {
		kind := o.GroupVersionKind().GroupKind()
		if kind.Group != rbacv1.GroupName || (kind.Kind != "ClusterRole" && kind.Kind != "Role") {
			continue
		}

		rules, why, err := roleRules(o)
		if err != nil {
			return ManifestAccess{}, err
		}

		ns := roleNamespace(o)
		key := kind.Kind + "/" + ns + "/" + o.GetName()

		if why != "" {
			defined[key] = false

			left = append(left, fmt.Sprintf("%s %s: %s", kind.Kind, qualified(ns, o.GetName()), why))

			continue
		}

		defined[key] = true
		held[ns] = append(held[ns], rules...)
	}

	for _, o := range objs {
		gvk := o.GroupVersionKind()

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

		if writable, why, err := bindable(o, defined, lookup); err != nil {
			return ManifestAccess{}, err
		} else if !writable {
			readOnly[key] = append(readOnly[key], o.GetName())
			left = append(left, fmt.Sprintf("%s %s: %s", gvk.Kind, qualified(ns, o.GetName()), why))

			continue
		} else if why != "" {
			// why names the role to bind: "ClusterRole/name" or "Role/name".
			kind, name, _ := strings.Cut(why, "/")
			res := "clusterroles"

			if kind == "Role" {
				res = "roles"
			}

			bk := objectKey{group: rbacv1.GroupName, resource: res, namespace: ns}
			bind[bk] = append(bind[bk], name)
		}

		if gvk.Group == rbacv1.GroupName && (gvk.Kind == "ClusterRole" || gvk.Kind == "Role") && !defined[gvk.Kind+"/"+ns+"/"+o.GetName()] {
			readOnly[key] = append(readOnly[key], o.GetName())

			continue
		}

		names[key] = append(names[key], o.GetName())
	}

	a := ManifestAccess{Namespaced: map[string][]rbacv1.PolicyRule{}}
	add := func(ns string, rules ...rbacv1.PolicyRule) {
		if ns == "" {
			a.Cluster = append(a.Cluster, rules...)
		} else {
			a.Namespaced[ns] = append(a.Namespaced[ns], rules...)
		}
	}

	for _, k := range sortedKeys(names) {
		add(k.namespace, rbacv1.PolicyRule{APIGroups: []string{k.group}, Resources: []string{k.resource}, Verbs: ManifestVerbs(), ResourceNames: uniqueSorted(names[k])})
	}

	for _, k := range sortedKeys(readOnly) {
		add(k.namespace, rbacv1.PolicyRule{APIGroups: []string{k.group}, Resources: []string{k.resource}, Verbs: []string{"get"}, ResourceNames: uniqueSorted(readOnly[k])})
	}

	for _, k := range sortedKeys(bind) {
		add(k.namespace, rbacv1.PolicyRule{APIGroups: []string{rbacv1.GroupName}, Resources: []string{k.resource}, Verbs: []string{"bind"}, ResourceNames: uniqueSorted(bind[k])})
	}

	for _, ns := range sortedStrings(held) {
		add(ns, held[ns]...)
	}

	if len(a.Namespaced) == 0 {
		a.Namespaced = nil
	}

	a.Left = left

	return a, nil
}

// bindable says whether the runner may write o as far as RBAC goes: a binding is writable
// when its role is defined by the manifests and held, or is a role outside them that
// grants nothing dangerous (then why is "Kind/name" of the role to bind); anything else is
// writable with why "".
func bindable(o *unstructured.Unstructured, defined map[string]bool, lookup RoleLookup) (bool, string, error) {
	gvk := o.GroupVersionKind()
	if gvk.Group != rbacv1.GroupName || (gvk.Kind != "ClusterRoleBinding" && gvk.Kind != "RoleBinding") {
		return true, "", nil
	}

	var ref rbacv1.RoleRef

	if err := fromUnstructured(o, "roleRef", &ref); err != nil {
		return false, "", err
	}

	ns := ""
	if gvk.Kind == "RoleBinding" {
		ns = o.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
	}

	refNS := ""
	if ref.Kind == "Role" {
		refNS = ns
	}

	if isHeld, ok := defined[ref.Kind+"/"+refNS+"/"+ref.Name]; ok {
		if isHeld {
			return true, "", nil
		}

		return false, fmt.Sprintf("binds %s %s, which the runner may not hold", ref.Kind, ref.Name), nil
	}

	if lookup == nil {
		return false, fmt.Sprintf("binds %s %s, not defined by the manifests", ref.Kind, ref.Name), nil
	}

	rules, found, err := lookup(ref.Kind, refNS, ref.Name)
	if err != nil {
		return false, "", fmt.Errorf("read %s %s bound by %s %s: %w", ref.Kind, ref.Name, gvk.Kind, o.GetName(), err)
	}

	if !found {
		return false, fmt.Sprintf("binds %s %s, which does not exist", ref.Kind, ref.Name), nil
	}

	if why := dangerous(rules); why != "" {
		return false, fmt.Sprintf("binds %s %s, which %s", ref.Kind, ref.Name, why), nil
	}

	return true, ref.Kind + "/" + ref.Name, nil
}

// roleRules are the rules of a manifest Role or ClusterRole, or why the runner may not
// hold them.
func roleRules(o *unstructured.Unstructured) ([]rbacv1.PolicyRule, string, error) {
	if _, found, _ := unstructured.NestedFieldNoCopy(o.Object, "aggregationRule"); found {
		return nil, "an aggregated ClusterRole (its rules are the aggregation controller's)", nil
	}

	var rules []rbacv1.PolicyRule

	if err := fromUnstructured(o, "rules", &rules); err != nil {
		return nil, "", err
	}

	if why := dangerous(rules); why != "" {
		return nil, why, nil
	}

	return rules, "", nil
}

// dangerous says why holding rules would let the runner grant itself more than it was
// given ("" when it would not).
func dangerous(rules []rbacv1.PolicyRule) string {
	for _, r := range rules {
		for _, v := range r.Verbs {
			switch v {
			case "*", "escalate", "bind", "impersonate":
				return fmt.Sprintf("grants %q", v)
			}
		}

		for _, res := range r.Resources {
			if res == "*" {
				return `grants resources "*"`
			}
		}

		if slices.Contains(r.APIGroups, "*") {
			return `grants apiGroups "*"`
		}
	}

	return ""
}

func fromUnstructured(o *unstructured.Unstructured, field string, into any) error {
	v, found, err := unstructured.NestedFieldCopy(o.Object, field)
	if err != nil || !found {
		return err
	}

	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, into)
	}

	if err != nil {
		return fmt.Errorf("%s %s: decode %s: %w", o.GetKind(), o.GetName(), field, err)
	}

	return nil
}

func roleNamespace(o *unstructured.Unstructured) string {
	if o.GetKind() == "ClusterRole" {
		return ""
	}

	if ns := o.GetNamespace(); ns != "" {
		return ns
	}

	return metav1.NamespaceDefault
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

func qualified(ns, name string) string {
	if ns == "" {
		return name
	}

	return ns + "/" + name
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
