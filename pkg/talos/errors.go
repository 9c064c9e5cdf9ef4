package talos

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc/codes"
)

// RequiredRole is the Talos role ichor's credentials need: reading the
// machine config (a sensitive resource) and applying it both take it.
const RequiredRole = role.Admin

// ErrPullUnsupported is returned by PullImage when the node implements
// neither ImageService.Pull nor the older MachineService.ImagePull: the node
// cannot pre-pull, and the caller skips the pre-pull.
var ErrPullUnsupported = errors.New("the node's Talos API cannot pre-pull images")

// NodeError is an error of one call to one node.
type NodeError struct {
	// Node is the node's address, as the call was addressed.
	Node string
	// Op names the call, such as "apply" or "read machine config".
	Op string
	// Err is the cause.
	Err error
}

// Error implements error. A permission error says which role is needed.
func (e *NodeError) Error() string {
	if IsPermissionDenied(e.Err) {
		return fmt.Sprintf("node %q: %s: permission denied: the Talos credentials need the %s role (%v): use a "+
			"talosconfig with that role, or in the cluster a talos.dev ServiceAccount with roles [%s]",
			e.Node, e.Op, RequiredRole, e.Err, RequiredRole)
	}

	return fmt.Sprintf("node %q: %s: %v", e.Node, e.Op, e.Err)
}

// Unwrap returns the cause.
func (e *NodeError) Unwrap() error { return e.Err }

func nodeErr(node, op string, err error) error {
	if err == nil {
		return nil
	}

	return &NodeError{Node: node, Op: op, Err: err}
}

// IsUnreachable reports whether err says the node (or the endpoint routing
// to it) could not be reached: a refused or reset connection, gRPC
// Unavailable, or a deadline that passed while still connecting. That is what
// a rebooting node looks like. A deadline that passes during a call that
// reached the node (a slow apply) is not unreachable, nor is a failed TLS
// handshake (credentials of another cluster).
func IsUnreachable(err error) bool {
	if err == nil {
		return false
	}

	switch client.StatusCode(err) {
	case codes.Unavailable:
		// A failed TLS handshake is a wrong talosconfig, not a reboot:
		// waiting would not fix it.
		return !strings.Contains(client.Status(err).Message(), "handshake failed")
	case codes.DeadlineExceeded:
		// grpc-go's wording when the deadline passed before a connection was
		// ready (picker_wrapper.go).
		msg := client.Status(err).Message()

		return strings.Contains(msg, "while waiting for connections to become ready") ||
			strings.HasPrefix(msg, "latest balancer error")
	}

	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}

	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}

// IsPermissionDenied reports whether err says the credentials lack a role
// for the call (gRPC PermissionDenied). The role needed is RequiredRole.
func IsPermissionDenied(err error) bool {
	return err != nil && client.StatusCode(err) == codes.PermissionDenied
}

// IsUnimplemented reports whether err says the node does not implement the
// call (gRPC Unimplemented): an older Talos.
func IsUnimplemented(err error) bool {
	return err != nil && client.StatusCode(err) == codes.Unimplemented
}
