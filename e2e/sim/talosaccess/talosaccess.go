package talosaccess

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client/config"
	"github.com/siderolabs/talos/pkg/machinery/config/generate/secrets"
	"github.com/siderolabs/talos/pkg/machinery/role"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

var (
	crdGVR              = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	talosAccountGVR     = schema.GroupVersionResource{Group: "talos.dev", Version: "v1alpha1", Resource: "serviceaccounts"}
	talosAccessEndpoint = "talos.default"
)

// Start does what Talos does with kubernetesTalosAPIAccess
// enabled: it installs the serviceaccounts.talos.dev CRD and, for each such
// ServiceAccount in an allowed namespace asking only allowed roles, writes a
// Secret of the same name whose key "config" is a talosconfig with a client
// certificate carrying those roles. Others are refused with an Event and
// status.failureReason.
func Start(ctx context.Context, cfg *rest.Config, bundle *secrets.Bundle, m *machine.Machine, log *slog.Logger) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1",
		"kind":       "CustomResourceDefinition",
		"metadata":   map[string]any{"name": "serviceaccounts.talos.dev"},
		"spec": map[string]any{
			"group": "talos.dev",
			"names": map[string]any{"kind": "ServiceAccount", "listKind": "ServiceAccountList", "plural": "serviceaccounts", "singular": "serviceaccount", "shortNames": []any{"tsa"}},
			"scope": "Namespaced",
			"versions": []any{map[string]any{
				"name": "v1alpha1", "served": true, "storage": true,
				"subresources": map[string]any{"status": map[string]any{}},
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{
						"spec": map[string]any{"type": "object", "properties": map[string]any{
							"roles": map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
						}},
						"status": map[string]any{"type": "object", "properties": map[string]any{
							"failureReason": map[string]any{"type": "string"},
						}},
					},
				}},
			}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("install CRD: %w", err)
	}
	// The CRD is served a moment after it is created.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = dyn.Resource(talosAccountGVR).List(ctx, metav1.ListOptions{Limit: 1})
		return last == nil, nil
	}); err != nil {
		return fmt.Errorf("serviceaccounts.talos.dev CRD not served after 30s: %v", last)
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
	inf := factory.ForResource(talosAccountGVR).Informer()
	handle := func(obj any) {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		if err := reconcileTalosAccount(ctx, client, dyn, bundle, m, u); err != nil {
			log.Info("talos service account", "namespace", u.GetNamespace(), "name", u.GetName(), "err", err)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: handle, UpdateFunc: func(_, o any) { handle(o) }}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	return nil
}

func reconcileTalosAccount(ctx context.Context, client kubernetes.Interface, dyn dynamic.Interface, bundle *secrets.Bundle, m *machine.Machine, u *unstructured.Unstructured) error {
	ns, name := u.GetNamespace(), u.GetName()
	roles, _, _ := unstructured.NestedStringSlice(u.Object, "spec", "roles")
	// Either form: machine.features.kubernetesTalosAPIAccess (nil when not
	// enabled) or Talos 1.14's KubeTalosAPIAccessConfig document.
	access := m.State().Config.K8sTalosAPIAccessConfig()
	refuse := func(reason string) error {
		_ = unstructured.SetNestedField(u.Object, reason, "status", "failureReason")
		_, _ = dyn.Resource(talosAccountGVR).Namespace(ns).UpdateStatus(ctx, u, metav1.UpdateOptions{})
		_, _ = client.CoreV1().Events(ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: name + "."},
			InvolvedObject: corev1.ObjectReference{APIVersion: "talos.dev/v1alpha1", Kind: "ServiceAccount", Namespace: ns, Name: name, UID: u.GetUID()},
			Type:           corev1.EventTypeWarning, Reason: "Refused", Message: reason,
			Source:         corev1.EventSource{Component: "talos"},
			FirstTimestamp: metav1.Now(), LastTimestamp: metav1.Now(), Count: 1,
		}, metav1.CreateOptions{})
		return fmt.Errorf("refused: %s", reason)
	}
	if access == nil {
		return refuse("Talos API access from Kubernetes is not enabled (machine.features.kubernetesTalosAPIAccess or a KubeTalosAPIAccessConfig document)")
	}
	if !slices.Contains(access.AllowedKubernetesNamespaces(), ns) {
		return refuse(fmt.Sprintf("namespace %q is not in allowedKubernetesNamespaces", ns))
	}
	for _, r := range roles {
		if !slices.Contains(access.AllowedRoles(), r) {
			return refuse(fmt.Sprintf("role %q is not in allowedRoles", r))
		}
	}
	set, unknown := role.Parse(roles)
	if len(unknown) > 0 {
		return refuse(fmt.Sprintf("unknown roles %v", unknown))
	}
	cert, err := bundle.GenerateTalosAPIClientCertificate(set)
	if err != nil {
		return err
	}
	tc := config.NewConfig(name, []string{talosAccessEndpoint}, bundle.Certs.OS.Crt, cert)
	data, err := tc.Bytes()
	if err != nil {
		return err
	}
	secrets := client.CoreV1().Secrets(ns)
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "talos.dev/v1alpha1", Kind: "ServiceAccount", Name: name, UID: u.GetUID(), Controller: new(true),
		}}},
		Data: map[string][]byte{"config": data},
	}
	if existing, err := secrets.Get(ctx, name, metav1.GetOptions{}); err == nil {
		if len(existing.Data["config"]) > 0 {
			return nil
		}
		existing.Data = sec.Data
		_, err = secrets.Update(ctx, existing, metav1.UpdateOptions{})
		return err
	}
	_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
