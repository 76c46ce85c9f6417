# Sourced by scripts/glslc_coopmat.sh and scripts/lavapipe_coopmat.sh: apt-get and
# apt-cache options for a private configuration in APT_DIR (a new temporary directory)
# that reads only $SUITE of $MIRROR, signed by Debian's archive keyring, so the system's
# sources, lists and state stay untouched. Sets APT_DIR and the array APT_OPTS; the
# caller removes APT_DIR. Needs fail() and SUITE/MIRROR from the caller.
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

sid_apt_setup() {
  [ -r "$KEYRING" ] || fail "no $KEYRING (apt-get install debian-archive-keyring)"
  APT_DIR=$(mktemp -d)
  mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial" "$APT_DIR/prefs"
  echo "deb [signed-by=$KEYRING] $MIRROR $SUITE main" > "$APT_DIR/sources.list"
  APT_OPTS=(-o "Dir::State=$APT_DIR" -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::State::status=/var/lib/dpkg/status"
            -o "Dir::Cache=$APT_DIR/cache" -o "Dir::Etc::SourceList=$APT_DIR/sources.list"
            -o "Dir::Etc::SourceParts=/dev/null" -o "Dir::Etc::Preferences=/dev/null"
            -o "Dir::Etc::PreferencesParts=$APT_DIR/prefs" -o "APT::Architecture=amd64"
            -o "APT::Architectures=amd64" -o "APT::Sandbox::User=$(id -un)")
}
