package manifests

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// UpgradeK8sResult is what a SyncAsUpgradeK8s did, each object as "Kind namespace/name".
type UpgradeK8sResult struct {
	Applied []string
	Pruned  []string
}

// SyncAsUpgradeK8s syncs objs (a control plane's bootstrap manifests) as talosctl
// upgrade-k8s does once every node runs Talos 1.13 or later
// (pkg/cluster/kubernetes/talos_managed.go, syncManifestsSSA, with go-kubernetes'
// ssa.Manager and its default inventory policy AdoptIfNoInventory):
//
//   - every object is marked with the inventory annotation (one marked for another
//     inventory is refused) and server-side applied under field manager "talos" with
//     conflicts forced (fluxcd's ssa takes every field over, whoever held it); an object
//     whose live copy belongs to another inventory is refused;
//   - every object applied is added to the inventory, which is written;
//   - then every object of the inventory that objs no longer hold is pruned: deleted
//     (propagation background) when its live copy carries this inventory's annotation or
//     none, refused when it carries another's; gone ones leave the inventory.
func (a *Applier) SyncAsUpgradeK8s(ctx context.Context, objs []*unstructured.Unstructured) (UpgradeK8sResult, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var res UpgradeK8sResult
	inv, err := ReadInventory(ctx, a.dyn)
	if err != nil {
		return res, fmt.Errorf("inventory: %w", err)
	}
	want := map[string]bool{}
	for _, obj := range objs {
		obj = obj.DeepCopy()
		annotations := obj.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		if v, set := annotations[InventoryAnnotation]; set && v != InventoryName {
			return res, fmt.Errorf("object %s already has an inventory annotation", describe(obj))
		}
		annotations[InventoryAnnotation] = InventoryName
		obj.SetAnnotations(annotations)
		ri, namespaced, leftOut, err := a.resource(obj)
		if err != nil {
			return res, err
		}
		if leftOut {
			return res, fmt.Errorf("apply %s: the cluster does not serve its kind", describe(obj))
		}
		if !namespaced {
			obj.SetNamespace("")
		}
		want[InventoryKey(obj)] = true
		if live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
			if v, set := live.GetAnnotations()[InventoryAnnotation]; set && v != InventoryName {
				return res, fmt.Errorf("inventory policy prevented actuation of %s (status: NoMatch, policy: AdoptIfNoInventory)", describe(obj))
			}
		} else if !apierrors.IsNotFound(err) {
			return res, err
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return res, err
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager, Force: &force}); err != nil {
			return res, fmt.Errorf("apply %s: %w", describe(obj), err)
		}
		inv.Add(InventoryKey(obj))
		res.Applied = append(res.Applied, describe(obj))
	}
	if err := inv.Write(ctx); err != nil {
		return res, err
	}
	var pruneErr error
	for _, key := range inv.Keys() {
		if want[key] {
			continue
		}
		ns, name, group, kind, ok := parseInventoryKey(key)
		if !ok {
			continue
		}
		mapping, err := a.mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind})
		if err != nil {
			pruneErr = errors.Join(pruneErr, err)
			continue
		}
		ri := a.dyn.Resource(mapping.Resource).Namespace(ns)
		if ns == "" {
			ri = a.dyn.Resource(mapping.Resource)
		}
		live, err := ri.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			inv.Remove(key)
			continue
		} else if err != nil {
			return res, err
		}
		if v, set := live.GetAnnotations()[InventoryAnnotation]; set && v != InventoryName {
			return res, fmt.Errorf("inventory policy prevented actuation of %s (status: NoMatch, policy: AdoptIfNoInventory)", describe(live))
		}
		background := metav1.DeletePropagationBackground
		if err := ri.Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &background}); err != nil && !apierrors.IsNotFound(err) {
			pruneErr = errors.Join(pruneErr, err)
			continue
		}
		inv.Remove(key)
		res.Pruned = append(res.Pruned, describe(live))
	}
	return res, errors.Join(pruneErr, inv.Write(ctx))
}
