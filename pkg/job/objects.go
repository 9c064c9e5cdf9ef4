package job

import (
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Exit codes of the runner, as the Job's podFailurePolicy reads them.
const (
	// ExitPaused means the operation paused on a failure: the Job fails at once (no
	// retry) and `kubectl ichor resume` continues it with a new Job.
	ExitPaused = 3
	// ExitFinal means this runner must never run again: the operation was aborted or
	// replaced, or its state cannot be read. The Job fails at once.
	ExitFinal = 4
	// ExitHandedOver means the runner handed the operation to a successor pod of its
	// Job, which holds the lock, before its own node's reboot: the Job ignores it (no
	// failure counted) and, its successor running, starts no other pod.
	ExitHandedOver = 5
)

// Job settings.
const (
	// BackoffLimit bounds the retries of a runner that crashed (an eviction is not
	// counted, a pause or an abort is never retried).
	BackoffLimit = 6
	// TTLAfterFinished keeps a finished Job and its pod's logs a week for the record.
	TTLAfterFinished = 7 * 24 * 60 * 60
	// TerminationGrace lets a stopped runner cancel its engine, write its last progress
	// and release the lock.
	TerminationGrace = 60
	// RunAsUser is the runner's non-root user (distroless' nonroot).
	RunAsUser = 65532
)

// TalosAccountGroupVersion is the API of Talos' ServiceAccount resource.
const TalosAccountGroupVersion = "talos.dev/v1alpha1"

// TalosRole is the Talos role the Job's credentials carry.
const TalosRole = "os:admin"

// ClusterRoleRules are the runner's cluster-wide permissions besides those of the
// bootstrap manifests (ManifestAccess): read and cordon nodes, read and evict pods for a
// drain, read DaemonSets (drain, kube-proxy rollout), disruption budgets and the
// apiserver's metrics for the checks, record events, and delete its own ClusterRole when
// the operation succeeded (its other RBAC objects and its ServiceAccount go with it).
// Nothing here creates, changes or binds a role.
func ClusterRoleRules(namespace string) []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods/eviction"}, Verbs: []string{"create"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"policy"}, Resources: []string{"poddisruptionbudgets"}, Verbs: []string{"list"}},
		{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}},
		{APIGroups: []string{rbacv1.GroupName}, Resources: []string{"clusterroles"}, Verbs: []string{"delete"}, ResourceNames: []string{ClusterRoleName(namespace)}},
	}
}

// lockNamespace is the namespace of the lock of the runner of namespace: LockRules go
// into the runner's Role there.
func lockNamespace(string) string { return LockNamespace }

// LockRules are the runner's permissions on its lock, in the namespace of the Lease.
func LockRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
		{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "update", "watch"}, ResourceNames: []string{LockName}},
	}
}

// RoleRules are the runner's permissions in its own namespace: the state; its Job's
// parallelism, which a hand-over raises to start a successor pod and the lock's holder
// sets back to 1 (the Jobs there are the product's own; their pod template cannot
// change once created); and the deletion of its Talos credentials (the talos.dev
// ServiceAccount, the Secret Talos wrote for it, a copied talosconfig) once the
// operation succeeded.
func RoleRules() []rbacv1.PolicyRule {
	return []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "update"}, ResourceNames: []string{StateName}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"delete"}, ResourceNames: []string{LocalTalosconfigName, TalosAccountName}},
		{APIGroups: []string{TalosAccountResource.Group}, Resources: []string{TalosAccountResource.Resource}, Verbs: []string{"delete"}, ResourceNames: []string{TalosAccountName}},
	}
}

// roleRulesByNamespace are the rules of the runner's Roles by namespace: RoleRules in its
// own, LockRules where its lock lives, access' rules in theirs.
func roleRulesByNamespace(namespace string, access ManifestAccess) map[string][]rbacv1.PolicyRule {
	rules := map[string][]rbacv1.PolicyRule{namespace: RoleRules()}
	lock := lockNamespace(namespace)
	rules[lock] = append(rules[lock], LockRules()...)

	for ns, r := range access.Namespaced {
		rules[ns] = append(rules[ns], r...)
	}

	return rules
}

// Namespace is the product's namespace.
func Namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: commonLabels(nil)},
	}
}

// RunnerObjects are the runner's identity and permissions for namespace, its ClusterRole
// first: the ClusterRole (ClusterRoleRules and access' cluster rules) and its binding; the
// ServiceAccount; its Role and RoleBinding in namespace (RoleRules, and access' rules of
// that namespace); a Role and RoleBinding in each other namespace access names, and in
// the namespace of its lock (LockRules). owner, when set (the ClusterRole once it
// exists), owns every object but the ClusterRole and the ServiceAccount, so that
// deleting the ClusterRole deletes every right the ServiceAccount has.
func RunnerObjects(namespace string, access ManifestAccess, owner *metav1.OwnerReference) []runtime.Object {
	subject := []rbacv1.Subject{{Kind: "ServiceAccount", Name: RunnerName, Namespace: namespace}}
	rbac := metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1"}
	labels := commonLabels(map[string]string{LabelRunnerNamespace: namespace})
	roles := roleRulesByNamespace(namespace, access)
	meta := func(name, ns string) metav1.ObjectMeta {
		m := metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}
		if owner != nil {
			m.OwnerReferences = []metav1.OwnerReference{*owner}
		}

		return m
	}

	objs := []runtime.Object{
		&rbacv1.ClusterRole{
			TypeMeta:   withKind(rbac, "ClusterRole"),
			ObjectMeta: metav1.ObjectMeta{Name: ClusterRoleName(namespace), Labels: labels},
			Rules:      append(ClusterRoleRules(namespace), access.Cluster...),
		},
		&rbacv1.ClusterRoleBinding{
			TypeMeta:   withKind(rbac, "ClusterRoleBinding"),
			ObjectMeta: meta(BindingName(namespace), ""),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: ClusterRoleName(namespace)},
			Subjects:   subject,
		},
		&corev1.ServiceAccount{
			// Not owned: the runner's end deletes the ClusterRole, and with it every
			// right, but keeps this account, which a container of its pod restarted
			// after that needs to start and exit (Runner.Run).
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{Name: RunnerName, Namespace: namespace, Labels: labels},
		},
		&rbacv1.Role{
			TypeMeta:   withKind(rbac, "Role"),
			ObjectMeta: meta(RunnerName, namespace),
			Rules:      roles[namespace],
		},
		&rbacv1.RoleBinding{
			TypeMeta:   withKind(rbac, "RoleBinding"),
			ObjectMeta: meta(RunnerName, namespace),
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: RunnerName},
			Subjects:   subject,
		},
	}

	for _, ns := range sortedStrings(roles) {
		if ns == namespace {
			continue
		}

		objs = append(objs,
			&rbacv1.Role{
				TypeMeta:   withKind(rbac, "Role"),
				ObjectMeta: meta(BindingName(namespace), ns),
				Rules:      roles[ns],
			},
			&rbacv1.RoleBinding{
				TypeMeta:   withKind(rbac, "RoleBinding"),
				ObjectMeta: meta(BindingName(namespace), ns),
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: BindingName(namespace)},
				Subjects:   subject,
			})
	}

	return objs
}

// ownedBy makes owner the owner of obj.
func ownedBy(obj runtime.Object, owner *metav1.OwnerReference) runtime.Object {
	if owner == nil {
		return obj
	}

	if m, err := meta.Accessor(obj); err == nil {
		m.SetOwnerReferences([]metav1.OwnerReference{*owner})
	}

	return obj
}

func withKind(t metav1.TypeMeta, kind string) metav1.TypeMeta {
	t.Kind = kind

	return t
}

// TalosAccount is the talos.dev/v1alpha1 ServiceAccount with role os:admin: Talos
// (machine.features.kubernetesTalosAPIAccess) answers it with a Secret of the same name
// whose key "config" is a talosconfig for the endpoint talos.default:50000.
func TalosAccount(namespace string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": TalosAccountGroupVersion,
		"kind":       "ServiceAccount",
		"metadata": map[string]any{
			"name":      TalosAccountName,
			"namespace": namespace,
			"labels":    toAny(commonLabels(nil)),
		},
		"spec": map[string]any{"roles": []any{TalosRole}},
	}}
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}

	return out
}

// LocalTalosconfig is the Secret holding a copy of the operator's talosconfig
// (--talos-credentials=local) for one operation.
func LocalTalosconfig(namespace, operation string, talosconfig []byte) *corev1.Secret {
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: LocalTalosconfigName, Namespace: namespace,
			Labels: commonLabels(map[string]string{LabelOperation: operation}),
		},
		Type: corev1.SecretTypeOpaque,
		Data: map[string][]byte{TalosconfigKey: talosconfig},
	}
}

// JobParams say which Job to build.
type JobParams struct {
	// Namespace is the product's namespace.
	Namespace string
	// Operation is the operation's ID.
	Operation string
	// Attempt numbers the Job of this operation: 1 at launch, one more per resume.
	Attempt int
	// Image is the runner's image (the release image of the plugin's version).
	Image string
	// Credentials say which Secret holds the Talos credentials.
	Credentials api.Credentials
	// StayOnNode makes the pod tolerate the cordon and tells the runner to
	// keep its own pod through its node's drain: no other node can host it
	// (RunnerHosts), so an evicted runner's replacement would stay Pending.
	StayOnNode bool
}

// StayOnNodeEnv is the runner's environment variable set ("true") by
// JobParams.StayOnNode.
const StayOnNodeEnv = "ICHOR_STAY_ON_NODE"

// Job is the Job that runs an operation: the plugin's own binary (`kubectl-ichor run`) in
// its release image, under the runner's ServiceAccount, with the Talos credentials mounted
// where Talos' client looks in a pod. An eviction costs no retry (DisruptionTarget is
// ignored), and so does a hand-over to a successor pod (ExitHandedOver); a pause or an
// abort fails the Job at once; a crash is retried a few times, and
// every new pod continues from the state ConfigMap.
func Job(p JobParams) *batchv1.Job {
	labels := commonLabels(map[string]string{LabelOperation: p.Operation})
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}

	tolerations := runnerTolerations()
	envs := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: field("metadata.name")},
		{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
		{Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
	}

	if p.StayOnNode {
		tolerations = append(tolerations, corev1.Toleration{
			Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
		})
		envs = append(envs, corev1.EnvVar{Name: StayOnNodeEnv, Value: "true"})
	}

	return &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: JobName(p.Operation, p.Attempt), Namespace: p.Namespace, Labels: labels},
		Spec: batchv1.JobSpec{
			// One pod at a time; a hand-over raises it to 2 a moment (handover.go). Set, so
			// that completions stays unset (with neither, the API server sets both to 1, and
			// completions 1 allows no second pod): a pod that succeeds ends the Job.
			Parallelism:             ptr.To[int32](1),
			BackoffLimit:            ptr.To[int32](BackoffLimit),
			TTLSecondsAfterFinished: ptr.To[int32](TTLAfterFinished),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{
					Action:          batchv1.PodFailurePolicyActionIgnore,
					OnPodConditions: []batchv1.PodFailurePolicyOnPodConditionsPattern{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue}},
				},
				{
					Action: batchv1.PodFailurePolicyActionIgnore,
					OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
						ContainerName: ptr.To(ContainerName),
						Operator:      batchv1.PodFailurePolicyOnExitCodesOpIn,
						Values:        []int32{ExitHandedOver},
					},
				},
				{
					Action: batchv1.PodFailurePolicyActionFailJob,
					OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
						ContainerName: ptr.To(ContainerName),
						Operator:      batchv1.PodFailurePolicyOnExitCodesOpIn,
						Values:        []int32{ExitPaused, ExitFinal},
					},
				},
			}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName:            RunnerName,
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](TerminationGrace),
					Tolerations:                   tolerations,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](RunAsUser),
						RunAsGroup:     ptr.To[int64](RunAsUser),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            ContainerName,
						Image:           p.Image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						Command:         []string{BinaryPath, "run", "--operation", p.Operation, "--namespace", p.Namespace},
						Env:             envs,
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
						},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{
							{Name: "talos", MountPath: TalosconfigDir, ReadOnly: true},
						},
					}},
					// The runner writes no file: the read-only root needs no scratch volume.
					Volumes: []corev1.Volume{
						// Optional: the runner deletes it at the operation's end, and a
						// container restarted after that must start to exit (Runner.Run).
						{Name: "talos", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
							SecretName: credentialsSecret(p.Credentials), Optional: ptr.To(true),
						}}},
					},
				},
			},
		},
	}
}

// describe names an object for messages: kind namespace/name.
func describe(kind, namespace, name string) string {
	if namespace == "" {
		return fmt.Sprintf("%s %s", kind, name)
	}

	return fmt.Sprintf("%s %s/%s", kind, namespace, name)
}
