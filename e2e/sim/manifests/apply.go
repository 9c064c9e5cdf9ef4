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

// Talos 1.14 marks each bootstrap manifest object it creates as a member of its
// inventory (internal/app/machined/pkg/controllers/k8s/manifest_apply.go, with
// go-kubernetes' ssa.InventoryAnnotationKey).
const (
	inventoryAnnotation = "config.k8s.io/owning-inventory"
	inventoryName       = "talos-bootstrap-manifests-inventory"
)

// Applier does what Talos' ManifestApplyController does on every control
// plane whenever its Manifest resources change: it creates the objects of the
// manifests that the cluster lacks, with field manager "talos", and never changes
// one that exists. Talos 1.14 also keeps an inventory of what it created (an object
// in it is never created again, even when deleted since) and marks each object it
// creates with the inventory annotation; Talos 1.13 and older create whatever is
// missing. The objects go in manifest ID order, Namespaces then
// CustomResourceDefinitions first. An object Talos takes for a problem of the
// manifest (a kind the cluster does not serve, one the apiserver rejects as bad or
// invalid) is logged and left out, and the others are applied; any other error
// stops the pass.
type Applier struct {
	dyn    dynamic.Interface
	mapper meta.ResettableRESTMapper
	log    *slog.Logger

	mu        sync.Mutex // one pass at a time, as Talos' etcd lock
	inventory map[string]bool
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
	return &Applier{
		dyn:       dyn,
		mapper:    restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)),
		log:       log,
		inventory: map[string]bool{},
	}, nil
}

// Apply makes one pass over m's manifests.
func (a *Applier) Apply(ctx context.Context, m *machine.Machine) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	list, err := safe.StateListAll[*k8s.Manifest](ctx, m.COSI())
	if err != nil {
		return fmt.Errorf("list manifests of %s: %w", m.Name(), err)
	}
	version, err := m.Version()
	if err != nil {
		return err
	}
	var major, minor int
	_, _ = fmt.Sscanf(version, "v%d.%d", &major, &minor)
	withInventory := major == 1 && minor >= 14
	var objs []*unstructured.Unstructured
	for res := range list.All() {
		for _, item := range res.TypedSpec().Items {
			objs = append(objs, (&unstructured.Unstructured{Object: item.Object}).DeepCopy())
		}
	}
	sort.SliceStable(objs, func(i, j int) bool { return applyRank(objs[i]) < applyRank(objs[j]) })
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			a.mapper.Reset()
			if mapping, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version); meta.IsNoMatchError(err) {
				a.log.Warn("bootstrap manifests: left out", "object", gvk.Kind+" "+obj.GetName(), "err", err)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
			}
		}
		var ri dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace(metav1.NamespaceDefault)
			}
			ri = a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		} else {
			obj.SetNamespace("")
		}
		key := strings.Join([]string{gvk.Group, gvk.Kind, obj.GetNamespace(), obj.GetName()}, "/")
		if withInventory && a.inventory[key] {
			continue
		}
		if _, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{}); err == nil {
			a.inventory[key] = true
			continue
		} else if !apierrors.IsNotFound(err) {
			return fmt.Errorf("get %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		if withInventory {
			annotations := obj.GetAnnotations()
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[inventoryAnnotation] = inventoryName
			obj.SetAnnotations(annotations)
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		_, err = ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "talos"})
		if apierrors.IsBadRequest(err) || apierrors.IsInvalid(err) || apierrors.IsMethodNotSupported(err) {
			a.log.Warn("bootstrap manifests: left out", "object", gvk.Kind+" "+obj.GetNamespace()+"/"+obj.GetName(), "err", err)
			continue
		}
		if err != nil {
			return fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		a.inventory[key] = true
		a.log.Info("bootstrap manifests: created", "object", gvk.Kind+" "+obj.GetNamespace()+"/"+obj.GetName(), "by", m.Name())
	}
	return nil
}

// Watch runs a pass on a control plane each time its Manifest resources change
// (a re-render after a config change, a boot), until ctx ends. A pass that fails is
// tried again a second later, as Talos' controller restarts.
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
			var b strings.Builder
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
