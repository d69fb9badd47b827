"""meshrun's tasks for `fab` (`fab -l`); the same one line works in any project's fabfile."""
from meshrun.deploy.tasks import *  # noqa: F401,F403
