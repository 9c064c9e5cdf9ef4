package talosapi

import (
	"context"

	"strings"

	"github.com/cosi-project/runtime/pkg/resource"
	"github.com/cosi-project/runtime/pkg/resource/meta"
	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/cosi-project/runtime/pkg/state"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// rules are the roles allowed per method, copied from Talos' machined rules
// for the methods served here (ImageService and LifecycleService follow
// their MachineService counterparts ImagePull and Upgrade). A method not
// listed needs os:admin, Talos' fallback.
func rules() map[string]role.Set {
	read := role.MakeSet(role.Admin, role.Operator, role.Reader)
	return map[string]role.Set{
		"/machine.MachineService/ApplyConfiguration": role.MakeSet(role.Admin),
		"/machine.MachineService/EtcdAlarmList":      role.MakeSet(role.Admin, role.Operator, role.Reader, role.EtcdBackup),
		"/machine.MachineService/EtcdMemberList":     role.MakeSet(role.Admin, role.Operator, role.Reader, role.EtcdBackup),
		"/machine.MachineService/EtcdSnapshot":       role.MakeSet(role.Admin, role.Operator, role.EtcdBackup),
		"/machine.MachineService/EtcdStatus":         role.MakeSet(role.Admin, role.Operator, role.Reader, role.EtcdBackup),
		"/machine.MachineService/ImagePull":          role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/Kubeconfig":         role.MakeSet(role.Admin),
		"/machine.MachineService/Logs":               read,
		"/machine.MachineService/Read":               role.MakeSet(role.Admin),
		"/machine.MachineService/Reboot":             role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/Rollback":           role.MakeSet(role.Admin),
		"/machine.MachineService/ServiceList":        read,
		"/machine.MachineService/ServiceRestart":     role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/ServiceStart":       role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/ServiceStop":        role.MakeSet(role.Admin, role.Operator),
		"/machine.MachineService/Upgrade":            role.MakeSet(role.Admin),
		"/machine.MachineService/Version":            read,
		"/machine.ImageService/Pull":                 role.MakeSet(role.Admin, role.Operator),
		"/machine.LifecycleService/Upgrade":          role.MakeSet(role.Admin),

		// per-type authorization is done by the COSI state (sensitive types)
		"/cosi.resource.State/Get":   read,
		"/cosi.resource.State/List":  read,
		"/cosi.resource.State/Watch": read,
	}
}

var errNotAuthorized = status.Error(codes.PermissionDenied, "not authorized")

// authorizer checks the caller's roles against the rules.
type authorizer struct {
	rules map[string]role.Set
}

func (a authorizer) check(ctx context.Context, method string) error {
	allowed, ok := a.rules[method]
	if !ok {
		allowed = role.MakeSet(role.Admin)
	}
	p, _ := peer.FromContext(ctx)
	if !rolesFromContext(p).IncludesAny(allowed) {
		return errNotAuthorized
	}
	return nil
}

func (a authorizer) unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := a.check(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

func (a authorizer) stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := a.check(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// accessPolicy is the rule Talos' COSI API puts in front of a node's
// resources: no writes ("write access is not allowed"); a resource type
// must be registered in the node's meta namespace ("resource type %q is not
// supported") and so must the namespace ("namespace %q is not supported"),
// all PermissionDenied; a Sensitive type (MachineConfig, APIServerConfig,
// KubeletSpec, ...) is readable with os:admin only.
func accessPolicy(st state.State) state.FilteringRule {
	return func(ctx context.Context, access state.Access) error {
		if !access.Verb.Readonly() {
			return status.Error(codes.PermissionDenied, "write access is not allowed")
		}
		rd, err := safe.StateGet[*meta.ResourceDefinition](ctx, st,
			resource.NewMetadata(meta.NamespaceName, meta.ResourceDefinitionType, strings.ToLower(access.ResourceType), resource.VersionUndefined))
		if err != nil {
			if state.IsNotFoundError(err) {
				return status.Errorf(codes.PermissionDenied, "resource type %q is not supported", access.ResourceType)
			}
			return err
		}
		if rd.TypedSpec().Sensitivity == meta.Sensitive {
			p, _ := peer.FromContext(ctx)
			if !rolesFromContext(p).Includes(role.Admin) {
				return errNotAuthorized
			}
		}
		if _, err := safe.StateGet[*meta.Namespace](ctx, st,
			resource.NewMetadata(meta.NamespaceName, meta.NamespaceType, access.ResourceNamespace, resource.VersionUndefined)); err != nil {
			if state.IsNotFoundError(err) {
				return status.Errorf(codes.PermissionDenied, "namespace %q is not supported", access.ResourceNamespace)
			}
			return err
		}
		return nil
	}
}
