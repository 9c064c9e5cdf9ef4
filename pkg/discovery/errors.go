package discovery

import (
	"errors"
	"fmt"
	"net"
	"net/url"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/ichor-dev/kubectl-ichor/pkg/text"
)

// ForbiddenError is a Kubernetes request RBAC denied.
type ForbiddenError struct {
	// Verb is the verb denied, e.g. "list".
	Verb string
	// Resource is the resource, with its group when not core, e.g. "poddisruptionbudgets.policy".
	Resource string
	// Namespace is the namespace asked for; "" means all namespaces or a cluster-scoped resource.
	Namespace string
	// Err is the API's error.
	Err error
}

func (e *ForbiddenError) Error() string {
	scope := "at cluster scope"
	if e.Namespace != "" {
		scope = "in namespace " + e.Namespace
	}

	return fmt.Sprintf("kubernetes RBAC denied %q on %q %s: grant it to your user (check with: kubectl auth can-i %s %s%s)",
		e.Verb, e.Resource, scope, e.Verb, e.Resource, nsFlag(e.Namespace))
}

func (e *ForbiddenError) Unwrap() error { return e.Err }

func nsFlag(ns string) string {
	if ns == "" {
		return " -A"
	}

	return " -n " + ns
}

// UnreachableError is an API that could not be reached.
type UnreachableError struct {
	// API is "kubernetes" or "talos".
	API string
	// Target is the address or node that was asked.
	Target string
	// Hint says what to check.
	Hint string
	// Err is the underlying error.
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("%s API at %s unreachable: %v: %s", e.API, e.Target, text.OneLine(e.Err.Error()), e.Hint)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// kubeError turns a failed request into an error that names the permission or the API.
func kubeError(endpoint, verb, resource, namespace string, err error) error {
	if apierrors.IsForbidden(err) {
		return &ForbiddenError{Verb: verb, Resource: resource, Namespace: namespace, Err: err}
	}

	if isUnreachable(err) {
		return &UnreachableError{
			API:    "kubernetes",
			Target: endpoint,
			Hint:   "check --kubeconfig and --context, and that the API server is up",
			Err:    err,
		}
	}

	return fmt.Errorf("kubernetes: %s %s: %w", verb, resource, err)
}

// isUnreachable reports errors of the transport, not of the API.
func isUnreachable(err error) bool {
	var (
		urlErr *url.Error
		netErr net.Error
	)

	return errors.As(err, &urlErr) || errors.As(err, &netErr) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
}
