package serve

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/authenticatorfactory"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/klog/v2"
)

// MetricsOptions say where and how the metrics endpoint is served.
type MetricsOptions struct {
	// Addr is the listen address; empty serves nothing.
	Addr string
	// Profiling adds Go's pprof handlers under /debug/pprof/ (behind the same authorization).
	Profiling bool
	// CertFile and KeyFile are the serving certificate; empty: a self-signed one made at start.
	CertFile, KeyFile string
	// Insecure serves plain HTTP to anyone, for local development only.
	Insecure bool
}

// AddFlags registers the metrics flags; addr is the default listen address.
func (o *MetricsOptions) AddFlags(fs *pflag.FlagSet, addr string) {
	fs.StringVar(&o.Addr, "metrics-addr", addr, "address of the HTTPS /metrics and /healthz endpoint (empty: off); /metrics needs a token allowed to get the non-resource URL /metrics")
	fs.StringVar(&o.CertFile, "metrics-cert-file", "", "serving certificate of the metrics endpoint (default: self-signed, made at start)")
	fs.StringVar(&o.KeyFile, "metrics-key-file", "", "private key of --metrics-cert-file")
	fs.BoolVar(&o.Insecure, "metrics-insecure", false, "serve /metrics over plain HTTP without authentication or authorization: names namespaces and claims to anyone who can reach the port; local development only")
}

// alwaysAllowed are served without a token: the kubelet's probes carry none, and they
// say nothing about tenants.
var alwaysAllowed = map[string]bool{"/healthz": true}

// delegated authenticates a request's bearer token with a TokenReview and authorizes the
// user for the request's non-resource path with a SubjectAccessReview, as kube-rbac-proxy
// and the Kubernetes components' own /metrics do: 401 without a valid token, 403 without
// the permission.
func delegated(authn authenticator.Request, authz authorizer.Authorizer, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if alwaysAllowed[r.URL.Path] {
			next.ServeHTTP(w, r)
			return
		}
		logger := klog.FromContext(r.Context())
		res, ok, err := authn.AuthenticateRequest(r)
		if err != nil || !ok {
			if err != nil {
				logger.V(2).Info("Metrics request not authenticated", "err", err, "remote", r.RemoteAddr)
			}
			http.Error(w, "Unauthorized: a bearer token the API server accepts is required", http.StatusUnauthorized)
			return
		}
		attrs := authorizer.AttributesRecord{User: res.User, Verb: strings.ToLower(r.Method), Path: r.URL.Path}
		decision, reason, err := authz.Authorize(r.Context(), attrs)
		if err != nil || decision != authorizer.DecisionAllow {
			logger.V(2).Info("Metrics request forbidden", "user", res.User.GetName(), "verb", attrs.Verb, "path", attrs.Path, "reason", reason, "err", err)
			http.Error(w, fmt.Sprintf("Forbidden: user %q may not %s the non-resource URL %s (bind the ClusterRole fgpu-metrics-reader)", res.User.GetName(), attrs.Verb, attrs.Path), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// delegatedAuth builds the TokenReview authenticator and SubjectAccessReview authorizer.
func delegatedAuth(client kubernetes.Interface) (authenticator.Request, authorizer.Authorizer, error) {
	// The Kubernetes components' default for their delegated authn/z webhooks.
	backoff := func() *wait.Backoff {
		return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Steps: 5}
	}
	authn, _, err := authenticatorfactory.DelegatingAuthenticatorConfig{
		TokenAccessReviewClient:  client.AuthenticationV1(),
		TokenAccessReviewTimeout: 10 * time.Second,
		WebhookRetryBackoff:      backoff(),
		CacheTTL:                 2 * time.Minute,
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authentication: %w", err)
	}
	authz, err := authorizerfactory.DelegatingAuthorizerConfig{
		SubjectAccessReviewClient: client.AuthorizationV1(),
		AllowCacheTTL:             5 * time.Minute,
		DenyCacheTTL:              30 * time.Second,
		WebhookRetryBackoff:       backoff(),
	}.New()
	if err != nil {
		return nil, nil, fmt.Errorf("metrics authorization: %w", err)
	}
	return authn, authz, nil
}

// servingCert loads the given certificate or makes a self-signed one for this host.
func (o MetricsOptions) servingCert() (tls.Certificate, error) {
	if o.CertFile != "" || o.KeyFile != "" {
		return tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey(host, []net.IP{net.ParseIP("127.0.0.1")}, []string{"localhost"})
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("self-signed metrics certificate: %w", err)
	}
	return tls.X509KeyPair(certPEM, keyPEM)
}
