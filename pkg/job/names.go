package job

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"strings"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Names of the objects kubectl-ichor creates. Namespaced ones live in the
// namespace the plugin is given (-n, default ichor-system).
const (
	// RunnerName names the runner's ServiceAccount, and its Role and RoleBinding in its
	// own namespace.
	RunnerName = "ichor-runner"
	// StateName is the state ConfigMap.
	StateName = "ichor-state"
	// LockName is the Lease that one runner at a time holds.
	LockName = "ichor-lock"
	// TalosAccountName is the talos.dev/v1alpha1 ServiceAccount (and the Secret Talos writes for it).
	TalosAccountName = "ichor-talos"
	// LocalTalosconfigName is the Secret that holds a copy of the operator's talosconfig
	// (--talos-credentials=local); it is deleted when the operation ends.
	LocalTalosconfigName = "ichor-talosconfig"
	// ContainerName is the runner's container in the Job's pod.
	ContainerName = "runner"
	// TalosconfigKey is the key of the talosconfig in a Talos credentials Secret.
	TalosconfigKey = "config"
	// TalosconfigDir is where the Talos credentials are mounted: the in-cluster
	// talosconfig path Talos' client searches.
	TalosconfigDir = "/var/run/secrets/talos.dev"
	// BinaryPath is the plugin's binary in the release image.
	BinaryPath = "/usr/local/bin/kubectl-ichor"
	// FieldManager is the field manager of everything the plugin applies.
	FieldManager = "kubectl-ichor"
)

// Labels and annotations.
const (
	// LabelOperation carries the operation ID on the state ConfigMap, the Job and its pods.
	LabelOperation = "ichor.dev/operation"
	// LabelRunnerNamespace marks the runner's RBAC objects with the namespace of its
	// operations, wherever they live, so that they are found and removed at the end.
	LabelRunnerNamespace = "ichor.dev/runner-namespace"
	// LabelPhase mirrors the operation's phase on the state ConfigMap, for kubectl get -L.
	LabelPhase = "ichor.dev/phase"
	// LabelName and LabelManagedBy are the recommended app labels on every object.
	LabelName      = "app.kubernetes.io/name"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// AppName is the value of LabelName and LabelManagedBy.
	AppName = "kubectl-ichor"
)

// credentialsSecret is the Secret that holds the Talos credentials of kind c.
func credentialsSecret(c api.Credentials) string {
	if c == api.CredentialsLocal {
		return LocalTalosconfigName
	}

	return TalosAccountName
}

// NewOperationID returns a fresh operation ID such as kubernetes-v1-36-3-7kq2x: the kind,
// the target and a random suffix, usable in object names and label values.
func NewOperationID(kind, target string) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"

	suffix := make([]byte, 5)

	for i := range suffix {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			// crypto/rand does not fail on supported platforms.
			panic(fmt.Sprintf("crypto/rand: %v", err))
		}

		suffix[i] = alphabet[n.Int64()]
	}

	return fmt.Sprintf("%s-%s-%s", kind, strings.ReplaceAll(target, ".", "-"), suffix)
}

// JobName is the name of an operation's Job for one attempt (1 for the launch, one more
// for each resume).
func JobName(operation string, attempt int) string {
	return fmt.Sprintf("ichor-%s-%d", operation, attempt)
}

// ClusterRoleName names the runner's ClusterRole of namespace: each operation's runner
// has its own, computed from the bootstrap manifests at launch.
func ClusterRoleName(namespace string) string {
	return BindingName(namespace)
}

// BindingName names the runner's objects outside its namespace (its ClusterRoleBinding,
// and its Roles and RoleBindings in other namespaces), so that runners of several
// namespaces keep theirs.
func BindingName(namespace string) string {
	return RunnerName + ":" + namespace
}

func commonLabels(extra map[string]string) map[string]string {
	l := map[string]string{LabelName: AppName, LabelManagedBy: AppName}
	for k, v := range extra {
		l[k] = v
	}

	return l
}
