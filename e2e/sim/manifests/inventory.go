package manifests

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// The inventory Talos 1.13 and later keep of their bootstrap manifest objects
// (machinery's constants.KubernetesInventoryNamespace and
// KubernetesBootstrapManifestsInventoryName; go-kubernetes' ssa.InventoryAnnotationKey
// marks the objects Talos creates, and every object talosctl upgrade-k8s applies).
const (
	InventoryNamespace  = "kube-system"
	InventoryName       = "talos-bootstrap-manifests-inventory"
	InventoryAnnotation = "config.k8s.io/owning-inventory"
)

var (
	configMaps = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	namespaces = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
)

// Inventory is the ConfigMap inventory as go-kubernetes' ssa package keeps it: one data
// key per object, its value empty.
type Inventory struct {
	dyn  dynamic.Interface
	keys map[string]bool
}

// ReadInventory reads the inventory, creating its namespace and an empty ConfigMap when
// they are missing, as Talos does at every pass.
func ReadInventory(ctx context.Context, dyn dynamic.Interface) (*Inventory, error) {
	if _, err := dyn.Resource(namespaces).Get(ctx, InventoryNamespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": InventoryNamespace}}}
		if _, err := dyn.Resource(namespaces).Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	cms := dyn.Resource(configMaps).Namespace(InventoryNamespace)
	cm, err := cms.Get(ctx, InventoryName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": InventoryName, "namespace": InventoryNamespace}}}
		if cm, err = cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	inv := &Inventory{dyn: dyn, keys: map[string]bool{}}
	data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
	for k := range data {
		inv.keys[k] = true
	}
	return inv, nil
}

// Has reports whether key is in the inventory.
func (i *Inventory) Has(key string) bool { return i.keys[key] }

// Add adds key.
func (i *Inventory) Add(key string) { i.keys[key] = true }

// Remove removes key.
func (i *Inventory) Remove(key string) { delete(i.keys, key) }

// Keys are the inventory's keys, sorted.
func (i *Inventory) Keys() []string {
	out := make([]string, 0, len(i.keys))
	for k := range i.keys {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Write replaces the ConfigMap's data with the inventory, as go-kubernetes does (an
// Update of a new object, so unconditional).
func (i *Inventory) Write(ctx context.Context) error {
	data := map[string]any{}
	for k := range i.keys {
		data[k] = ""
	}
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": InventoryName, "namespace": InventoryNamespace}, "data": data}}
	_, err := i.dyn.Resource(configMaps).Namespace(InventoryNamespace).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

// rbacKinds are the kinds whose names may hold a colon, which an inventory key writes
// as "__" (cli-utils' ObjMetadata).
var rbacKinds = map[string]bool{"Role": true, "ClusterRole": true, "RoleBinding": true, "ClusterRoleBinding": true}

// InventoryKey is obj's inventory key, "<namespace>_<name>_<group>_<kind>" as cli-utils'
// ObjMetadata.String writes it (a colon in an RBAC object's name as "__").
func InventoryKey(obj *unstructured.Unstructured) string {
	gvk := obj.GroupVersionKind()
	name := obj.GetName()
	if gvk.Group == "rbac.authorization.k8s.io" && rbacKinds[gvk.Kind] {
		name = strings.ReplaceAll(name, ":", "__")
	}
	return fmt.Sprintf("%s_%s_%s_%s", obj.GetNamespace(), name, gvk.Group, gvk.Kind)
}

// parseInventoryKey splits a key back into namespace, name, group and kind.
func parseInventoryKey(key string) (ns, name, group, kind string, ok bool) {
	first := strings.Index(key, "_")
	last := strings.LastIndex(key, "_")
	if first < 0 || last <= first {
		return "", "", "", "", false
	}
	ns, rest, kind := key[:first], key[first+1:last], key[last+1:]
	mid := strings.LastIndex(rest, "_")
	if mid < 0 {
		return "", "", "", "", false
	}
	name, group = rest[:mid], rest[mid+1:]
	if group == "rbac.authorization.k8s.io" && rbacKinds[kind] {
		name = strings.ReplaceAll(name, "__", ":")
	}
	return ns, name, group, kind, true
}
