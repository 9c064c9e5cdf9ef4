package job

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	watchtools "k8s.io/client-go/tools/watch"
)

// Lease timings of the lock: a runner renews every RetryPeriod and stops changing
// anything when it could not renew for RenewDeadline; another may take the lock once
// LeaseDuration passed without a renewal.
//
// They are longer than client-go's usual 15/10/2 s: every control-plane reboot leaves a
// few seconds in which a request may go to the apiserver that went away, and a runner
// that lost its lock stops (the Job's next pod continues, but each such exit counts
// against the Job's backoffLimit). A runner cut off stops acting 10 s before another
// may take the lock.
const (
	LeaseDuration = 30 * time.Second
	RenewDeadline = 20 * time.Second
	RetryPeriod   = 2 * time.Second
)

// LockRequestTimeout bounds each request of the lock's client (see LockClientConfig):
// a renewal (a read, then a write) is tried at least twice in a RenewDeadline.
const LockRequestTimeout = 4 * time.Second

// LockClientConfig is cfg for the client that renews the lock: each request bounded by
// LockRequestTimeout, over HTTP/1.1. A control plane that reboots leaves the connections
// to its apiserver open and silent: over HTTP/2 every request shares one of them, and a
// renewal waits on it past the RenewDeadline (client-go's HTTP/2 health check notices a
// dead connection only after 45 s); over HTTP/1.1 a request that timed out closes its
// connection, and the next try opens one to an apiserver that answers.
func LockClientConfig(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = LockRequestTimeout
	cfg.NextProtos = []string{"http/1.1"}

	return cfg
}

// DefaultNamespace is the product's namespace when -n is not given.
const DefaultNamespace = "ichor-system"

// LockNamespace is where the lock lives whatever the product's namespace (-n) is: one
// operation per cluster, since two operations in two namespaces could otherwise, say,
// reboot two control planes together. Its holder is "<namespace>/<pod>" of the runner.
const LockNamespace = metav1.NamespaceSystem

// launchGrace is how long a Pending operation without a Job or a lock holder counts as
// being launched (rather than abandoned).
const launchGrace = 2 * time.Minute

// Lock is the Lease as read.
type Lock struct {
	// Holder is the runner pod that holds (or last held) the lock, as
	// "<namespace>/<pod>"; "" when released.
	Holder string
	// Renewed is the holder's last renewal; Duration how long it is valid for.
	Renewed  time.Time
	Duration time.Duration
	// Acquired is when the holder took it.
	Acquired time.Time

	resourceVersion string
}

// HeldAt reports whether the lock is held and not expired at now.
func (l *Lock) HeldAt(now time.Time) bool {
	return l != nil && l.Holder != "" && now.Before(l.Renewed.Add(l.Duration))
}

// HolderIdentity is the lock's holder identity of the runner pod pod of namespace.
func HolderIdentity(namespace, pod string) string { return namespace + "/" + pod }

// splitHolder returns the namespace and the pod of a holder identity; namespace is ""
// when holder does not name one.
func splitHolder(holder string) (namespace, pod string) {
	if ns, name, ok := strings.Cut(holder, "/"); ok {
		return ns, name
	}

	return "", holder
}

// HolderNamespace is the product's namespace of the lock's holder ("" when none).
func (l *Lock) HolderNamespace() string {
	if l == nil {
		return ""
	}

	ns, _ := splitHolder(l.Holder)

	return ns
}

// ReadLock reads the cluster's lock; nil when there is none.
func ReadLock(ctx context.Context, client kubernetes.Interface) (*Lock, error) {
	lease, err := client.CoordinationV1().Leases(LockNamespace).Get(ctx, LockName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}

	if err != nil {
		return nil, fmt.Errorf("read %s: %w", describe("lease", LockNamespace, LockName), err)
	}

	return lockOf(lease), nil
}

func lockOf(lease *coordinationv1.Lease) *Lock {
	l := &Lock{resourceVersion: lease.ResourceVersion}

	if lease.Spec.HolderIdentity != nil {
		l.Holder = *lease.Spec.HolderIdentity
	}

	if lease.Spec.LeaseDurationSeconds != nil {
		l.Duration = time.Duration(*lease.Spec.LeaseDurationSeconds) * time.Second
	}

	if lease.Spec.RenewTime != nil {
		l.Renewed = lease.Spec.RenewTime.Time
	}

	if lease.Spec.AcquireTime != nil {
		l.Acquired = lease.Spec.AcquireTime.Time
	}

	return l
}

// holderGone reports whether the lock's holder ("<namespace>/<pod>") has stopped for
// good: its pod is gone or has ended (its containers stopped), so it changes nothing any
// more. A holder that names no namespace is not known to be gone.
func holderGone(ctx context.Context, client kubernetes.Interface, holder string) (bool, error) {
	namespace, name := splitHolder(holder)
	if namespace == "" {
		return false, nil
	}

	pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true, nil
	}

	if err != nil {
		return false, fmt.Errorf("read the lock holder's %s: %w", describe("pod", namespace, name), err)
	}

	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed, nil
}

// liveHolder returns the lock's holder ("<namespace>/<pod>") when it holds the lock and
// runs, "" otherwise.
func liveHolder(ctx context.Context, client kubernetes.Interface, now time.Time) (string, *Lock, error) {
	lock, err := ReadLock(ctx, client)
	if err != nil || !lock.HeldAt(now) {
		return "", lock, err
	}

	gone, err := holderGone(ctx, client, lock.Holder)
	if err != nil {
		return "", lock, err
	}

	if gone {
		return "", lock, nil
	}

	return lock.Holder, lock, nil
}

// releaseLock clears the lock's holder, on the condition that the Lease did not change
// since lock was read, so that a runner waiting for it takes it at once.
func releaseLock(ctx context.Context, client kubernetes.Interface, lock *Lock) error {
	if lock == nil || lock.Holder == "" {
		return nil
	}

	namespace := LockNamespace
	leases := client.CoordinationV1().Leases(namespace)

	lease, err := leases.Get(ctx, LockName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}

	if err != nil {
		return fmt.Errorf("read %s: %w", describe("lease", namespace, LockName), err)
	}

	if lease.ResourceVersion != lock.resourceVersion {
		return fmt.Errorf("release %s: %w", describe("lease", namespace, LockName), errLockChanged)
	}

	empty := ""
	lease.Spec.HolderIdentity = &empty

	if _, err := leases.Update(ctx, lease, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("release %s: %w", describe("lease", namespace, LockName), errLockChanged)
		}

		return fmt.Errorf("release %s: %w", describe("lease", namespace, LockName), err)
	}

	return nil
}

var errLockChanged = errors.New("another runner took it meanwhile")

// awaitRelease watches the lock, read as lock and held by another, for up to
// bound and returns once its holder has released it or another holds it: a
// runner waiting for a lock that is about to be released (the runner it
// takes over from in a hand-over) then tries for it at once, rather than at
// its elector's next retry (RetryPeriod and up to 1.2 times as much again:
// 2 to 4.4 s later). It returns at bound, when ctx ends or when the watch
// cannot be had or ends (an older Role without the watch): the elector's
// own retries go on from there, as without it.
func awaitRelease(ctx context.Context, client kubernetes.Interface, lock *Lock, bound time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()

	w, err := client.CoordinationV1().Leases(LockNamespace).Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", LockName).String(),
		ResourceVersion: lock.resourceVersion,
	})
	if err != nil {
		return
	}

	// Any end is an end of the wait: released, taken, deleted, the watch over.
	_, _ = watchtools.UntilWithoutRetry(ctx, w, func(ev watch.Event) (bool, error) {
		lease, ok := ev.Object.(*coordinationv1.Lease)
		if ev.Type == watch.Deleted || !ok {
			return true, nil
		}

		now := lockOf(lease)

		return now.Holder != lock.Holder || now.Holder == "", nil
	})
}

// nsFlag is the -n flag that names namespace in a suggested command, "" for the default.
func nsFlag(namespace string) string {
	if namespace == DefaultNamespace || namespace == "" {
		return ""
	}

	return " -n " + namespace
}

// renewingLock is the elector's Lease lock, noting when the last of its writes that
// succeeded was sent: from that moment the Lease is renewed, so nobody else takes it
// before LeaseDuration has passed (the fence's deadline, without reading the Lease).
type renewingLock struct {
	resourcelock.Interface

	mu   sync.Mutex
	last time.Time
}

// Create implements resourcelock.Interface.
func (l *renewingLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := time.Now()
	err := l.Interface.Create(ctx, ler)
	l.note(sent, ler, err)

	return err
}

// Update implements resourcelock.Interface.
func (l *renewingLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	sent := time.Now()
	err := l.Interface.Update(ctx, ler)
	l.note(sent, ler, err)

	return err
}

func (l *renewingLock) note(sent time.Time, ler resourcelock.LeaderElectionRecord, err error) {
	if err != nil || ler.HolderIdentity != l.Identity() {
		return
	}

	l.mu.Lock()
	l.last = sent
	l.mu.Unlock()
}

// renewed is when the last renewal was sent; ok is false before the first.
func (l *renewingLock) renewed() (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()

	return l.last, !l.last.IsZero()
}
