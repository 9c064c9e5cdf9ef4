package manifests

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/resources/k8s"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// FieldManager is the field manager Talos creates and applies its bootstrap manifest
// objects with (machinery's constants.KubernetesFieldManagerName).
const FieldManager = "talos"

// Applier does what Talos' ManifestApplyController does on every control plane whenever
// its Manifest resources change or it boots, as the Talos version that runs it does
// (internal/app/machined/pkg/controllers/k8s/manifest_apply.go):
//
//   - Talos 1.12 and older create each object the cluster lacks with a plain Create under
//     field manager "talos" (managedFields: manager "talos", operation Update), and leave
//     an existing one alone;
//   - Talos 1.13 and later keep an inventory of the objects, the ConfigMap
//     kube-system/talos-bootstrap-manifests-inventory (see Inventory): an object in it is
//     skipped (never created again, even when deleted since); one that exists is added to
//     it (the migration from the inventory-less versions: no annotation is added); one
//     that is missing is created by server-side apply under "talos" (operation Apply),
//     marked with the inventory annotation, and added. The inventory is written at the
//     end of the pass, even one that failed half way.
//
// Neither version changes an existing object nor deletes one: pruning from the inventory
// is talosctl upgrade-k8s' (see SyncAsUpgradeK8s). The objects go in manifest ID order,
// Namespaces then CustomResourceDefinitions first. An object Talos takes for a problem of
// the manifest (a kind the cluster does not serve, one the apiserver rejects as bad or
// invalid) is logged and left out, and the others are applied; any other error stops the
// pass.
type Applier struct {
	dyn    dynamic.Interface
	mapper meta.ResettableRESTMapper
	log    *slog.Logger

	mu sync.Mutex // one pass at a time, as Talos' etcd lock
}

// NewApplier returns an Applier to the cluster of cfg.
func NewApplier(cfg *rest.Config, log *slog.Logger) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return newApplier(dyn, dc, log), nil
}

func newApplier(dyn dynamic.Interface, dc discovery.DiscoveryInterface, log *slog.Logger) *Applier {
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), log: log}
}

// Apply makes one pass over m's manifests as the Talos version m runs does.
func (a *Applier) Apply(ctx context.Context, m *machine.Machine) error {
	version, err := m.Version()
	if err != nil {
		return err
	}
	return a.ApplyAs(ctx, m, version)
}

// ApplyAs makes one pass over m's manifests as Talos version does: the bootstrap of a
// cluster born on that version.
func (a *Applier) ApplyAs(ctx context.Context, m *machine.Machine, version string) error {
	objs, err := Objects(ctx, m)
	if err != nil {
		return err
	}
	return a.applyObjects(ctx, m.Name(), version, objs)
}

// applyObjects makes one pass over objs (in apply order), read from control plane by,
// as Talos version does.
func (a *Applier) applyObjects(ctx context.Context, by, version string, objs []*unstructured.Unstructured) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !TracksInventory(version) {
		return a.createMissing(ctx, by, objs)
	}
	inv, err := ReadInventory(ctx, a.dyn)
	if err != nil {
		return fmt.Errorf("inventory: %w", err)
	}
	applyErr := a.applyMissing(ctx, by, objs, inv)
	// Talos writes the inventory even when the pass failed half way.
	if err := inv.Write(ctx); err != nil {
		return fmt.Errorf("write inventory: %w", err)
	}
	return applyErr
}

// TracksInventory reports whether Talos version keeps the bootstrap manifests'
// inventory: Talos 1.13 and later.
func TracksInventory(version string) bool {
	var major, minor int
	_, _ = fmt.Sscanf(version, "v%d.%d", &major, &minor)
	return major > 1 || (major == 1 && minor >= 13)
}

// Objects are m's bootstrap manifest objects, in the order Talos applies them: manifest
// ID order, Namespaces then CustomResourceDefinitions first.
func Objects(ctx context.Context, m *machine.Machine) ([]*unstructured.Unstructured, error) {
	list, err := safe.StateListAll[*k8s.Manifest](ctx, m.COSI())
	if err != nil {
		return nil, fmt.Errorf("list manifests of %s: %w", m.Name(), err)
	}
	var objs []*unstructured.Unstructured
	for res := range list.All() {
		for _, item := range res.TypedSpec().Items {
			objs = append(objs, (&unstructured.Unstructured{Object: item.Object}).DeepCopy())
		}
	}
	sort.SliceStable(objs, func(i, j int) bool { return applyRank(objs[i]) < applyRank(objs[j]) })
	return objs, nil
}

// resource maps obj to its resource client, defaulting the namespace of a namespaced
// object as Talos does. leftOut is true for a kind Talos takes for a problem of the
// manifest (logged, the pass goes on).
func (a *Applier) resource(obj *unstructured.Unstructured) (ri dynamic.ResourceInterface, namespaced, leftOut bool, err error) {
	gvk := obj.GroupVersionKind()
	mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		a.mapper.Reset()
		mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsInvalid(err) || meta.IsNoMatchError(err):
		a.log.Warn("bootstrap manifests: left out", "object", gvk.Kind+" "+obj.GetName(), "err", err)
		return nil, false, true, nil
	case err != nil:
		return nil, false, false, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
		return a.dyn.Resource(mapping.Resource), false, false, nil
	}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(metav1.NamespaceDefault)
	}
	return a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace()), true, false, nil
}

// malformed is an error Talos takes for a problem of the object: it logs it and goes on.
func malformed(err error) bool {
	return apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err)
}

// createMissing is the pass of Talos 1.12 and older: a plain Create, under field manager
// "talos", of each object the cluster lacks.
func (a *Applier) createMissing(ctx context.Context, by string, objs []*unstructured.Unstructured) error {
	for _, obj := range objs {
		ri, namespaced, leftOut, err := a.resource(obj)
		if err != nil {
			return err
		}
		if leftOut {
			continue
		}
		if !namespaced {
			obj.SetNamespace("")
		}
		name := describe(obj)
		if _, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
			continue
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get %s: %w", name, err)
		}
		_, err = ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: FieldManager})
		switch {
		case apierrors.IsAlreadyExists(err):
		case malformed(err):
			a.log.Warn("bootstrap manifests: left out", "object", name, "err", err)
		case err != nil:
			return fmt.Errorf("create %s: %w", name, err)
		default:
			a.log.Info("bootstrap manifests: created", "object", name, "by", by, "as", "Create")
		}
	}
	return nil
}

// applyMissing is the pass of Talos 1.13 and later over inv: see Applier.
func (a *Applier) applyMissing(ctx context.Context, by string, objs []*unstructured.Unstructured, inv *Inventory) error {
	for _, obj := range objs {
		ri, namespaced, leftOut, err := a.resource(obj)
		if err != nil {
			return err
		}
		if leftOut {
			continue
		}
		if !namespaced {
			// Talos 1.13.0 kept a cluster-scoped object with a namespace in its
			// manifest under that namespace; later versions drop that entry.
			if obj.GetNamespace() != "" && inv.Has(InventoryKey(obj)) {
				inv.Remove(InventoryKey(obj))
				continue
			}
			obj.SetNamespace("")
		}
		key, name := InventoryKey(obj), describe(obj)
		if inv.Has(key) {
			continue
		}
		if _, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
			inv.Add(key)
			continue
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get %s: %w", name, err)
		}
		annotations := obj.GetAnnotations()
		if annotations == nil {
			annotations = map[string]string{}
		}
		if v, set := annotations[InventoryAnnotation]; set && v != InventoryName {
			a.log.Warn("bootstrap manifests: left out", "object", name, "err", "a foreign inventory annotation "+v)
			continue
		}
		annotations[InventoryAnnotation] = InventoryName
		obj.SetAnnotations(annotations)
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: FieldManager})
		switch {
		case malformed(err):
			a.log.Warn("bootstrap manifests: left out", "object", name, "err", err)
		case err != nil:
			return fmt.Errorf("apply %s: %w", name, err)
		default:
			inv.Add(key)
			a.log.Info("bootstrap manifests: created", "object", name, "by", by, "as", "server-side apply")
		}
	}
	return nil
}

func describe(obj *unstructured.Unstructured) string {
	if obj.GetNamespace() == "" {
		return obj.GetKind() + " " + obj.GetName()
	}
	return obj.GetKind() + " " + obj.GetNamespace() + "/" + obj.GetName()
}

// Watch runs a pass on a control plane each time its Manifest resources change (a
// re-render after a config change) and at each of its boots, as the Talos version it
// runs then does, until ctx ends. A pass that fails is tried again a second later, as
// Talos' controller restarts.
func (a *Applier) Watch(ctx context.Context, controlPlanes []*machine.Machine) {
	seen := map[string]string{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, m := range controlPlanes {
			if _, err := m.Version(); err != nil {
				continue // down
			}
			list, err := safe.StateListAll[*k8s.Manifest](ctx, m.COSI())
			if err != nil {
				continue
			}
			// Every boot renders the resources anew (versions from 1): the
			// boot ID tells a boot's first render from the last one's.
			var b strings.Builder
			b.WriteString(m.State().BootID + ";")
			for r := range list.All() {
				fmt.Fprintf(&b, "%s@%s;", r.Metadata().ID(), r.Metadata().Version())
			}
			if seen[m.Name()] == b.String() {
				continue
			}
			if err := a.Apply(ctx, m); err != nil {
				if ctx.Err() == nil {
					a.log.Warn("bootstrap manifests", "node", m.Name(), "err", err)
				}
				continue
			}
			seen[m.Name()] = b.String()
		}
	}
}

// applyRank puts Namespaces, then CustomResourceDefinitions, before
// everything else, as Talos sorts the objects it applies.
func applyRank(obj *unstructured.Unstructured) int {
	switch obj.GroupVersionKind().GroupKind().String() {
	case "Namespace":
		return 0
	case "CustomResourceDefinition.apiextensions.k8s.io":
		return 1
	default:
		return 2
	}
}
