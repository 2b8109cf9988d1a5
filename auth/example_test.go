package auth_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/starintel/starlease/auth"
	"github.com/starintel/starlease/lease"
)

func Example() {
	ctx := context.Background()
	pepper, _ := auth.NewPepper([]byte(strings.Repeat("p", 32))) // LoadPepper(path) in a server
	store := auth.NewMemoryStore()                               // OpenFileStore(DIR/credentials)

	scope, _ := auth.ParseScope("tenant:tenant-main,program:program-a,target-namespace:*,target:*,actor:*")
	key, cred, err := auth.Issue(ctx, store, pepper, auth.IssueRequest{
		PrincipalID:  "prn_scanner",
		Class:        auth.ClassServiceInstance,
		Capabilities: []auth.Capability{auth.CapLease},
		Scope:        scope,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("key shown once:", strings.HasPrefix(key, "star_sk_v1_"+cred.ID+"_"))

	authn, _ := auth.NewAuthenticator(store, pepper, nil)
	p, err := authn.Authenticate(ctx, []string{"Bearer " + key})
	fmt.Println("authenticated:", p.ID, p.Class, err)

	wrong := key[:len(key)-1] + map[bool]string{true: "1", false: "0"}[strings.HasSuffix(key, "0")]
	_, err = authn.Authenticate(ctx, []string{"Bearer " + wrong})
	fmt.Println("wrong key:", err)

	id := lease.Identity{TenantID: "tenant-main", ProgramID: "program-a", TargetNamespace: "starintel-target",
		TargetID: "target-1", ActorName: "usernamegen", WorkflowName: "default", OperationClass: "default"}
	fmt.Println("acquire:", auth.AuthorizeAcquire(p, id))
	id.TenantID = "tenant-other"
	fmt.Println("cross-tenant:", auth.AuthorizeAcquire(p, id))

	auth.Revoke(ctx, store, cred.ID)
	_, err = authn.Authenticate(ctx, []string{"Bearer " + key})
	fmt.Println("after revoke:", err)
	// Output:
	// key shown once: true
	// authenticated: prn_scanner service_instance <nil>
	// wrong key: invalid_credential
	// acquire: <nil>
	// cross-tenant: access_denied: identity outside the credential's scope
	// after revoke: invalid_credential
}
