package main

// This file is rain serve's user identity: whether grabs are checked
// against the app's signed user tokens (--user-auth), and what rain says
// when they are not, or not fully.

import (
	"fmt"
	"strings"

	"rain/internal/api"
	"rain/internal/auth"
	"rain/internal/shard"
)

// userAuthNone is --user-auth's value for "off, on purpose".
const userAuthNone = "none"

// Warnings of the user identity rain serve runs with: logged at start and
// given to /readyz's admin answer.
const (
	warnUserAuthOff  = "user auth is off (--user-auth none): any client can grab as any user_id, and is answered another user's grant; give --user-auth to check the app's signed user tokens"
	warnNoAudience   = "user tokens' aud is not checked (--user-auth-audience): a token the login service signed for another app is taken"
	warnNoIssuer     = "user tokens' iss is not checked (--user-auth-issuer): a token another issuer signed with a key of the set is taken"
	errUserAuthNeeds = "--user-auth (RAIN_USER_AUTH) is required with --redis: give the app's login service's key (jwks-url:https://..., hs256:FILE, ...), or --user-auth none to run without, on purpose (any client can then grab as any user_id)"
)

// userAuth sets acfg.Users from --user-auth and returns what SIGHUP
// reloads of it. Off ("" on embedded shards, or "none") is refused on real
// shards unless said ("none"), and warned of; on, a missing audience or
// issuer is warned of.
func (s *server) userAuth(acfg *api.Config) ([]reloader, error) {
	c := s.cfg
	switch {
	case c.UserAuth == "" && !c.tryIt():
		return nil, usagef(errUserAuthNeeds)
	case c.UserAuth == "" || c.UserAuth == userAuthNone:
		if !c.tryIt() {
			s.warn(warnUserAuthOff)
		}
		return nil, nil
	}
	users, err := auth.NewUsers(auth.UserConfig{Spec: c.UserAuth, Audience: c.UserAudience, Issuer: c.UserIssuer,
		Leeway: c.UserLeeway, Refresh: c.UserRefresh, AllowHTTP: c.UserAllowHTTP})
	if err != nil && shard.Unreachable(err) {
		return nil, fmt.Errorf("--user-auth: %w", err) // a jwks-url that does not answer
	}
	if err != nil {
		return nil, usagef("--user-auth: %w", err)
	}
	s.release = append(s.release, users.Close)
	acfg.Users = users
	if c.UserAudience == "" {
		s.warn(warnNoAudience)
	}
	if c.UserIssuer == "" {
		s.warn(warnNoIssuer)
	}
	if kind, file, _ := strings.Cut(c.UserAuth, ":"); strings.EqualFold(kind, "hs256") {
		warnReadable(s.log, "--user-auth", file)
	}
	return []reloader{{"user auth keys", func() error {
		if err := users.Reload(); err != nil {
			return fmt.Errorf("%w (the keys loaded before stay in use)", err)
		}
		return nil
	}}}, nil
}

// warn logs what an operator must not miss, and keeps it for /readyz.
func (s *server) warn(msg string) {
	s.log.Warn(msg)
	s.warnings = append(s.warnings, msg)
}
