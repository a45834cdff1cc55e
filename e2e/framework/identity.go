package framework

import (
	"context"
	"fmt"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// Tenant is an ordinary user of one namespace: a ServiceAccount bound to the `edit`
// ClusterRole there and nothing else, as a team that shares the cluster's GPUs gets. The
// tenancy suite attacks through it, never through the admin's credentials.
type Tenant struct {
	Namespace string
	// User is the tenant's user name, system:serviceaccount:<ns>:<name>.
	User string
	// Config impersonates the tenant (user and groups as its token would give them).
	Config *rest.Config
	Client kubernetes.Interface
	admin  kubernetes.Interface
	sa     string
}

// Tenant creates a ServiceAccount with `edit` in ns and returns clients that act as it.
func (c *Cluster) Tenant(t *testing.T, ns, name string) *Tenant {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
	}
	if _, err := c.Client.RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(c.Config)
	user := fmt.Sprintf("system:serviceaccount:%s:%s", ns, name)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: user,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tn := &Tenant{Namespace: ns, User: user, Config: cfg, Client: client, admin: c.Client, sa: name}
	// RBAC caches take a moment: wait until the binding is in force.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("tenant %s cannot list claims in its own namespace: %v", user, err)
	}
	return tn
}

// Token is a short-lived bearer token of the tenant's ServiceAccount, for endpoints that
// authenticate the caller themselves (not through the API server's impersonation).
func (tn *Tenant) Token(ctx context.Context) (string, error) {
	tr, err := tn.admin.CoreV1().ServiceAccounts(tn.Namespace).CreateToken(ctx, tn.sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return tr.Status.Token, nil
}

// CreateAs creates the pod's template and the pod with the given client (a tenant's).
func (p *GPUPod) CreateAs(ctx context.Context, client kubernetes.Interface) (*corev1.Pod, error) {
	if _, err := client.ResourceV1().ResourceClaimTemplates(p.ns).Create(ctx, p.Template(), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return client.CoreV1().Pods(p.ns).Create(ctx, p.Pod(), metav1.CreateOptions{})
}
