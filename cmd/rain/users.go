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
	warnUserAuthOff   = "user auth is off (--user-auth none): any client can grab as any user_id, and is answered another user's grant; give --user-auth to check the app's signed user tokens"
	warnUserAuthUnset = "user auth is off: no --user-auth (RAIN_USER_AUTH) was given, so any client can grab as any user_id, and is answered another user's grant; give the app's login service's key (jwks-url:https://..., hs256:FILE, ...), or --user-auth none to say it is off on purpose"
	warnNoAudience    = "user tokens' aud is not checked (--user-auth-audience): a token the login service signed for another app is taken"
	warnNoIssuer      = "user tokens' iss is not checked (--user-auth-issuer): a token another issuer signed with a key of the set is taken"
)

// userAuth sets acfg.Users from --user-auth and returns what SIGHUP
// reloads of it. Off on real shards is warned of, loudly when no word was
// given ("" rather than "none"); the contract's command line (API.md:
// --listen, --redis, --admin-token) runs, with user auth off, as the
// contract has it optional. On, a missing audience or issuer is warned of.
func (s *server) userAuth(acfg *api.Config) ([]reloader, error) {
	c := s.cfg
	switch {
	case c.UserAuth == "" && !c.tryIt():
		s.warn(warnUserAuthUnset)
		return nil, nil
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
