"""What a drafter checkpoint means: layout recipes, backbone families, manifests of known targets and releases, and
:class:`~dsparkhub.layouts.spec.DraftSpec`, the one description of a drafter after reading."""
