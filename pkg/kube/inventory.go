package kube

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

// Talos 1.13 and later keep an inventory of their bootstrap manifest objects: the
// ConfigMap InventoryNamespace/InventoryName, one data key per object
// (internal/app/machined/pkg/controllers/k8s/manifest_apply.go; machinery's
// constants.KubernetesInventoryNamespace and KubernetesBootstrapManifestsInventoryName).
// At each pass Talos' controller skips an object of the inventory (it never creates it
// again), records one that exists, and creates one that is missing with
// InventoryAnnotation; it prunes nothing. talosctl upgrade-k8s (1.13+, go-kubernetes'
// ssa.Manager) marks every object it applies, records it, and prunes the inventory's
// objects that the manifests no longer hold.
const (
	InventoryNamespace = "kube-system"
	InventoryName      = "talos-bootstrap-manifests-inventory"
	// InventoryAnnotation marks an object as a member of an inventory (go-kubernetes'
	// ssa.InventoryAnnotationKey), its value the inventory's name.
	InventoryAnnotation = "config.k8s.io/owning-inventory"
)

var configMapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// InventoryVerbs are what the runner may do to the inventory ConfigMap, by name: read it
// and record the objects it synced.
func InventoryVerbs() []string { return []string{"get", "update"} }

// rbacKinds are the kinds whose names may hold a colon, which an inventory key writes as
// "__" (cli-utils' ObjMetadata.String, which go-kubernetes' inventory uses).
var rbacKinds = map[string]bool{"Role": true, "ClusterRole": true, "RoleBinding": true, "ClusterRoleBinding": true}

// inventoryKey is obj's key in the inventory, "<namespace>_<name>_<group>_<kind>", with
// ns the namespace it is applied to ("" for a cluster-scoped object, as Talos 1.13.1+
// records it whatever its manifest says).
func inventoryKey(obj *unstructured.Unstructured, ns string) string {
	gvk := obj.GroupVersionKind()
	name := obj.GetName()

	if gvk.Group == "rbac.authorization.k8s.io" && rbacKinds[gvk.Kind] {
		name = strings.ReplaceAll(name, ":", "__")
	}

	return fmt.Sprintf("%s_%s_%s_%s", ns, name, gvk.Group, gvk.Kind)
}

// inventoryKey is obj's inventory key, false when its kind cannot be mapped.
func (a *ManifestApplier) inventoryKey(obj *unstructured.Unstructured) (string, bool) {
	_, ns, err := a.resource(obj)
	if err != nil {
		return "", false
	}

	return inventoryKey(obj, ns), true
}

// markInventory returns obj as the sync applies it: with the live object's
// InventoryAnnotation, if it has one (applied under Talos' field manager without it, the
// object would lose it, so that an unchanged manifest would change the object and its
// membership of Talos' inventory); and, when the object does not exist and Talos keeps an
// inventory (inventory), with the annotation Talos 1.13+ creates it with. An object the
// manifest marks itself is applied as it is; so is one whose live copy cannot be read.
func markInventory(ctx context.Context, ri dynamic.ResourceInterface, obj *unstructured.Unstructured, inventory bool) *unstructured.Unstructured {
	if _, set := obj.GetAnnotations()[InventoryAnnotation]; set {
		return obj
	}

	var value string

	live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})

	switch {
	case err == nil:
		v, ok := live.GetAnnotations()[InventoryAnnotation]
		if !ok {
			return obj
		}

		value = v
	case apierrors.IsNotFound(err) && inventory:
		value = InventoryName
	default:
		return obj
	}

	obj = obj.DeepCopy()
	annotations := obj.GetAnnotations()

	if annotations == nil {
		annotations = map[string]string{}
	}

	annotations[InventoryAnnotation] = value
	obj.SetAnnotations(annotations)

	return obj
}

// inventoryPresent reports whether the cluster has Talos' inventory: its Talos (1.13+)
// keeps one.
func (a *ManifestApplier) inventoryPresent(ctx context.Context) (bool, error) {
	err := Retry(ctx, 0, func(ctx context.Context) error {
		_, err := a.dyn.Resource(configMapsGVR).Namespace(InventoryNamespace).Get(ctx, InventoryName, metav1.GetOptions{})

		return err
	})

	switch {
	case err == nil:
		return true, nil
	case apierrors.IsNotFound(err):
		return false, nil
	default:
		return false, fmt.Errorf("read Talos' inventory of the bootstrap manifests (configmap %s/%s): %w", InventoryNamespace, InventoryName, err)
	}
}

// recordInventory adds keys to the inventory, as Talos' pass records the objects that
// exist: then Talos' next pass skips them, and talosctl upgrade-k8s prunes only what the
// manifests dropped. The other keys are kept. The update is conditional on the version
// read, and read again on a conflict (Talos' controller writes the inventory too).
func (a *ManifestApplier) recordInventory(ctx context.Context, keys []string) error {
	cms := a.dyn.Resource(configMapsGVR).Namespace(InventoryNamespace)

	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, InventoryName, metav1.GetOptions{})
		if err != nil {
			return err
		}

		data, _, _ := unstructured.NestedStringMap(cm.Object, "data")
		if data == nil {
			data = map[string]string{}
		}

		missing := false

		for _, k := range keys {
			if _, ok := data[k]; !ok {
				data[k], missing = "", true
			}
		}

		if !missing {
			return nil
		}

		if err := unstructured.SetNestedStringMap(cm.Object, data, "data"); err != nil {
			return err
		}

		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})

		return err
	})
	if err != nil {
		return fmt.Errorf("record the synced objects in Talos' inventory (configmap %s/%s): %w", InventoryNamespace, InventoryName, err)
	}

	return nil
}
