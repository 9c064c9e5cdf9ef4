package talos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name          string
		err           error
		unreachable   bool
		denied        bool
		unimplemented bool
	}{
		{name: "nil"},
		{name: "unavailable", err: status.Error(codes.Unavailable, "connection error"), unreachable: true},
		{
			name:        "deadline while connecting",
			err:         status.Error(codes.DeadlineExceeded, "context deadline exceeded while waiting for connections to become ready"),
			unreachable: true,
		},
		{
			name:        "deadline with a balancer error",
			err:         status.Error(codes.DeadlineExceeded, "latest balancer error: connection refused"),
			unreachable: true,
		},
		{name: "deadline during a call that reached the node", err: status.Error(codes.DeadlineExceeded, "context deadline exceeded")},
		{name: "plain context deadline", err: context.DeadlineExceeded},
		{
			name:        "routed by apid, in a node error",
			err:         fmt.Errorf("apply: %w", &client.NodeError{Node: "10.0.0.11", Err: status.Error(codes.Unavailable, "dial tcp: connection refused")}),
			unreachable: true,
		},
		{
			name: "TLS handshake: wrong credentials, not a reboot",
			err:  status.Error(codes.Unavailable, "connection error: desc = \"transport: authentication handshake failed: tls: failed to verify certificate\""),
		},
		{name: "dial error", err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, unreachable: true},
		{name: "connection reset", err: fmt.Errorf("read: %w", syscall.ECONNRESET), unreachable: true},
		{name: "permission denied", err: &NodeError{Node: "n", Op: "apply", Err: status.Error(codes.PermissionDenied, "not authorized")}, denied: true},
		{name: "unimplemented", err: status.Error(codes.Unimplemented, "unknown method Pull"), unimplemented: true},
		{name: "other", err: errors.New("boom")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.unreachable, IsUnreachable(tc.err), "IsUnreachable")
			assert.Equal(t, tc.denied, IsPermissionDenied(tc.err), "IsPermissionDenied")
			assert.Equal(t, tc.unimplemented, IsUnimplemented(tc.err), "IsUnimplemented")
		})
	}
}

func TestNodeErrorText(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  *NodeError
		want string
	}{
		{
			name: "plain",
			err:  &NodeError{Node: "10.0.0.11", Op: "apply", Err: errors.New("boom")},
			want: `node "10.0.0.11": apply: boom`,
		},
		{
			name: "permission denied names the role",
			err:  &NodeError{Node: "10.0.0.11", Op: "read machine config", Err: status.Error(codes.PermissionDenied, "not authorized")},
			want: `node "10.0.0.11": read machine config: permission denied: the Talos credentials need the os:admin role ` +
				`(rpc error: code = PermissionDenied desc = not authorized): use a talosconfig with that role, or in the ` +
				`cluster a talos.dev ServiceAccount with roles [os:admin]`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, tc.err.Error())
		})
	}
}

// TestUnreachableNode dials a port nothing listens on, as a rebooting node
// looks, through the real client.
func TestUnreachableNode(t *testing.T) {
	home := isolate(t)
	path := filepath.Join(home, "talosconfig")
	writeTalosconfig(t, path, "", "prod")

	// Reserve a port and free it, so nothing listens there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	c, err := Open(t.Context(), Options{ConfigPath: path, Endpoints: []string{addr}})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, c.Close()) })

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	_, err = c.Version(ctx, "127.0.0.1")
	require.Error(t, err)
	assert.True(t, IsUnreachable(err), "%v", err)

	var nodeErr *NodeError
	require.ErrorAs(t, err, &nodeErr)
	assert.Equal(t, "127.0.0.1", nodeErr.Node)
	assert.Equal(t, "version", nodeErr.Op)
}
