package job

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	api "github.com/ichor-dev/kubectl-ichor/pkg/api/v1alpha1"
)

// Default bounds of Control.
const (
	// DefaultCredentialsTimeout bounds the wait for Talos to write the Job's credentials.
	DefaultCredentialsTimeout = time.Minute
	// DefaultStopTimeout bounds abort's wait for the runner to stop: its grace period,
	// then the lock's expiry.
	DefaultStopTimeout = TerminationGrace*time.Second + LeaseDuration + 15*time.Second
)

// Control is the operator's handle on the operations of one namespace: it launches,
// resumes and aborts them, and keeps to one operation at a time.
type Control struct {
	// Kube and Dynamic reach the cluster with the operator's credentials.
	Kube    kubernetes.Interface
	Dynamic dynamic.Interface
	// Namespace is the product's namespace.
	Namespace string
	// Access is what the runner may do to re-apply the bootstrap manifests, computed from
	// them when the operation is launched or resumed (ComputeAccess); empty for a Talos
	// upgrade, which applies none. nil keeps the runner's permissions as they are when it
	// has them (a resume that could not read the manifests), else gives it none.
	Access *ManifestAccess
	// CredentialsTimeout bounds the wait for Talos' credentials Secret (0: the default).
	CredentialsTimeout time.Duration
	// StopTimeout bounds abort's wait for the runner to stop (0: the default).
	StopTimeout time.Duration
	// Poll is how often waits look again (0: one second).
	Poll time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c *Control) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}

	return time.Now()
}

func (c *Control) poll() time.Duration {
	if c.Poll > 0 {
		return c.Poll
	}

	return time.Second
}

func (c *Control) applier() applier { return applier{kube: c.Kube, dyn: c.Dynamic} }

// Store is the state ConfigMap of the namespace.
func (c *Control) Store() *Store {
	return &Store{Client: c.Kube.CoreV1(), Namespace: c.Namespace, Now: c.Now}
}

// Get returns the namespace's operation (ErrNoOperation, wrapped, when there is none).
func (c *Control) Get(ctx context.Context) (*api.Operation, error) {
	op, _, err := c.Store().Get(ctx)

	return op, err
}

// jobFinished returns the condition that ended a Job, if any.
func jobFinished(j *batchv1.Job) (batchv1.JobCondition, bool) {
	for _, cond := range j.Status.Conditions {
		if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
			return cond, true
		}
	}

	return batchv1.JobCondition{}, false
}

var errReplaced = errors.New("the operation was replaced by another")

func (c *Control) deleteJob(ctx context.Context, name string) error {
	if name == "" {
		return nil
	}

	err := c.Kube.BatchV1().Jobs(c.Namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: ptrTo(metav1.DeletePropagationBackground)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete %s: %w", describe("job", c.Namespace, name), err)
	}

	return nil
}

func ptrTo[T any](v T) *T { return &v }

// Pods returns the pods of an operation's Jobs, oldest first.
func (c *Control) Pods(ctx context.Context, operation string) ([]corev1.Pod, error) {
	sel := labels.Set{LabelOperation: operation}.String()

	pods, err := c.Kube.CoreV1().Pods(c.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("list the pods of operation %s: %w", operation, err)
	}

	items := pods.Items
	sort.SliceStable(items, func(i, j int) bool {
		return items[i].CreationTimestamp.Before(&items[j].CreationTimestamp)
	})

	return items, nil
}
